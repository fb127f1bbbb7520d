# How hpac is installed. Included by the top-level CMakeLists.txt before the
# targets are created (the RPATH settings initialise their properties);
# hpac_install_package() at the end writes the rules.
#
# Two layouts:
#  * the Python wheel (pyproject.toml; scikit-build-core sets SKBUILD): libhpac.so,
#    into the package as hpac/lib/libhpac.so, with an RPATH to the torch package
#    beside it in site-packages ($ORIGIN/../../torch/lib); with it
#    hpac/lib/libhpac_config.so (hpac.hf's config parser and route planner) and
#    hpac/share/hpac/model_registry.yaml;
#  * cmake --install (C++ users; find_package(hpac)):
#      lib/libhpac.so                         target hpac::hpac
#      lib/libhpac_{trainer,tools,dist}.a     target hpac::trainer (when HPAC_WITH_TRAINER)
#      include/hpac/<folder>/<header>.h       the source tree's folders (policy, replay, plugin; tools with the
#                                             trainer); the include directory is include/hpac, so installed code
#                                             includes exactly as in-tree code does: "replay/checkpoint.h"
#      lib/cmake/hpac/hpacConfig.cmake        checks that find_package(Torch) found the torch hpac was built for
#      bin/hpac-demo, bin/hpac-explain, bin/hpac-launch, bin/hpac-train (+ share/hpac/model_registry.yaml)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(HPAC_INSTALL_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}/hpac")
set(HPAC_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/hpac")
if(SKBUILD)
  set(CMAKE_INSTALL_RPATH "$ORIGIN/../../torch/lib")
else()
  # Installed binaries find libhpac in ../lib and torch where it was at build time (named explicitly: CMake leaves
  # link directories inside the source tree, such as the project's .venv, out of an installed RPATH).
  set(CMAKE_INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  if(EXISTS "${TORCH_INSTALL_PREFIX}/lib/libc10.so")
    list(APPEND CMAKE_INSTALL_RPATH "${TORCH_INSTALL_PREFIX}/lib")
  endif()
endif()

# hpac_public_usage(TARGET): what a user of TARGET needs, stated so that it also
# holds in the installed tree: the source root as include directory (installed:
# include/hpac) and torch (installed: hpacConfig.cmake adds the consumer's own
# TORCH_LIBRARIES from find_package(Torch) to hpac::hpac, which every other
# exported target links).
function(hpac_public_usage target)
  target_include_directories(${target} PUBLIC "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>"
                                              "$<INSTALL_INTERFACE:${HPAC_INSTALL_INCLUDEDIR}>")
  target_link_libraries(${target} PUBLIC "$<BUILD_INTERFACE:${TORCH_LIBRARIES}>")
endfunction()

# Headers: every .h of the named source folders, so that new files are installed without a list to keep.
function(hpac_install_headers)
  foreach(folder IN LISTS ARGN)
    install(DIRECTORY "${PROJECT_SOURCE_DIR}/${folder}/" DESTINATION "${HPAC_INSTALL_INCLUDEDIR}/${folder}"
            FILES_MATCHING PATTERN "*.h" PATTERN "python" EXCLUDE)
  endforeach()
endfunction()

function(hpac_install_package)
  if(SKBUILD)
    install(TARGETS hpac LIBRARY DESTINATION hpac/lib)
    if(TARGET hpac_config)  # hpac.hf's config, registry and route planner, and the registry it reads
      install(TARGETS hpac_config LIBRARY DESTINATION hpac/lib)
      install(FILES "${PROJECT_SOURCE_DIR}/tools/trainer/model_registry.yaml" DESTINATION hpac/share/hpac)
    endif()
    return()
  endif()
  install(TARGETS hpac EXPORT hpacTargets LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
  hpac_install_headers(policy replay plugin)
  install(EXPORT hpacTargets NAMESPACE hpac:: DESTINATION "${HPAC_INSTALL_CMAKEDIR}")

  set(cli)
  foreach(tool hpac-demo hpac-explain hpac-launch hpac-train)
    if(TARGET ${tool})
      list(APPEND cli ${tool})
    endif()
  endforeach()
  if(cli)
    install(TARGETS ${cli} RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
  endif()
  if(TARGET hpac_trainer)
    set_target_properties(hpac_trainer PROPERTIES EXPORT_NAME trainer)
    set_target_properties(hpac_moe PROPERTIES EXPORT_NAME moe)
    set_target_properties(hpac_evidence PROPERTIES EXPORT_NAME evidence)
    set_target_properties(hpac_distributed PROPERTIES EXPORT_NAME distributed)
    set_target_properties(hpac_trainer_config PROPERTIES EXPORT_NAME trainer_config)
    install(TARGETS hpac_trainer hpac_trainer_config hpac_moe hpac_evidence hpac_distributed EXPORT hpacTrainerTargets
            ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
    install(EXPORT hpacTrainerTargets NAMESPACE hpac:: DESTINATION "${HPAC_INSTALL_CMAKEDIR}")
    hpac_install_headers(tools)
    # hpac-train looks for the registry in ../share/hpac/ beside its binary (tools/trainer/registry.cpp).
    install(FILES "${PROJECT_SOURCE_DIR}/tools/trainer/model_registry.yaml"
            DESTINATION "${CMAKE_INSTALL_DATADIR}/hpac")
  endif()

  set(HPAC_BUILT_FOR_TORCH "${Torch_VERSION}")
  configure_package_config_file("${PROJECT_SOURCE_DIR}/tools/cmake/hpacConfig.cmake.in"
                                "${PROJECT_BINARY_DIR}/hpacConfig.cmake" INSTALL_DESTINATION "${HPAC_INSTALL_CMAKEDIR}")
  write_basic_package_version_file("${PROJECT_BINARY_DIR}/hpacConfigVersion.cmake" COMPATIBILITY SameMinorVersion)
  install(FILES "${PROJECT_BINARY_DIR}/hpacConfig.cmake" "${PROJECT_BINARY_DIR}/hpacConfigVersion.cmake"
          DESTINATION "${HPAC_INSTALL_CMAKEDIR}")
endfunction()
