"""The C++ Google Benchmark programs (built into build/bench/ by tools/build.sh) and their report sections."""
