# Sourced by the accelerator scripts (tools/gpu_check.sh, tools/gpu_level1.sh): builds libhpac and the config library
# (hpac.hf's libhpac_config) against $python's torch into $root/build-gpu, logging to $out/build.log, and exports
# HPAC_LIBRARY and HPAC_CONFIG_LIBRARY. The config library needs abseil and yaml-cpp: the system's, or Debian 12's
# packages unpacked from HPAC_DEB_DIR (default .debs/ in the checkout; made on a Debian 12 machine with
# `apt-get download libabsl-dev libabsl20220623 libyaml-cpp-dev libyaml-cpp0.7`). Expects root, python, out and a
# `say` function; exits 1 when the build fails.
hpac_gpu_build() {
  local debs=${HPAC_DEB_DIR:-$root/.debs} build=$root/build-gpu start prefix
  start=$(date +%s)
  prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  if ls "$debs"/*.deb >/dev/null 2>&1; then
    for f in "$debs"/*.deb; do dpkg-deb -x "$f" /tmp/hpac-debs; done
    prefix="$prefix;/tmp/hpac-debs/usr"
    export LD_LIBRARY_PATH=/tmp/hpac-debs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    say "abseil and yaml-cpp from $(ls "$debs"/*.deb | wc -l) Debian packages in $debs"
  fi
  if ! { cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
           -DHPAC_TORCH_PYTHON="$python" -DHPAC_PYTHON="$python" -DHPAC_WITH_TESTS=OFF -DHPAC_WITH_BENCH=OFF &&
         cmake --build "$build" -j "$(nproc)" --target hpac hpac_config; } >"$out/build.log" 2>&1; then
    tail -20 "$out/build.log"
    say "build failed (whole log: $out/build.log); the config library needs abseil and yaml-cpp (tools/gpu_build.sh)"
    exit 1
  fi
  say "built in $(( $(date +%s) - start )) s"
  export HPAC_LIBRARY=$build/plugin/libhpac.so HPAC_CONFIG_LIBRARY=$build/tools/trainer/libhpac_config.so
}
