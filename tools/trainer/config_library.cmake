# The trainer's YAML side (config, registry), discovery's rules and the route planner on their own:
# hpac_trainer_config, linked into hpac_trainer and into libhpac_config.so, which
# exposes them to Python as torch.ops.hpac_config.* (one parser and one planner
# for both front ends, docs/python.md). Included by tools/trainer/CMakeLists.txt,
# and by the top level when only the core is built for the Python wheel
# (HPAC_WITH_CONFIG_LIBRARY, pyproject.toml), so that hpac.hf works from a
# `pip install .`. Needs yaml-cpp and abseil (Debian: libyaml-cpp-dev, libabsl-dev).
find_package(yaml-cpp REQUIRED)
find_package(absl REQUIRED)

add_library(hpac_trainer_config STATIC
  ${CMAKE_CURRENT_LIST_DIR}/yaml_reader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/registry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_finder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/route_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/route_plan_json.cpp)
hpac_public_usage(hpac_trainer_config)
target_link_libraries(hpac_trainer_config PUBLIC hpac yaml-cpp absl::status absl::statusor absl::strings ${CMAKE_DL_LIBS})
hpac_warnings(hpac_trainer_config)

add_library(hpac_config MODULE ${CMAKE_CURRENT_LIST_DIR}/config_ops.cpp)
# The libraries it was built with, as `python -m hpac` prints them (the wheel bundles these; tools/package_test.sh).
target_compile_definitions(hpac_config PRIVATE HPAC_YAML_CPP_VERSION="${yaml-cpp_VERSION}"
  HPAC_ABSL_VERSION="${absl_VERSION}")
target_link_libraries(hpac_config PRIVATE hpac_trainer_config)
hpac_warnings(hpac_config)
# Installed in the wheel beside libhpac.so (hpac/lib/), which it links.
set_target_properties(hpac_config PROPERTIES INSTALL_RPATH "$ORIGIN;${CMAKE_INSTALL_RPATH}")

# The registry is data shipped with hpac: found through HPAC_MODEL_REGISTRY, then
# beside the program or the library holding this code, then in ../share/hpac/ from
# either (installed; the wheel's hpac/share/hpac/), then in this source folder.
configure_file(${CMAKE_CURRENT_LIST_DIR}/model_registry.yaml ${CMAKE_CURRENT_BINARY_DIR}/model_registry.yaml COPYONLY)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/registry.cpp PROPERTIES COMPILE_DEFINITIONS
  HPAC_TRAINER_SOURCE_REGISTRY="${CMAKE_CURRENT_LIST_DIR}/model_registry.yaml")
