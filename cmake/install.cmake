# Installing attnkit for other projects: the libraries and headers under the export set attnkit-targets, a CMake
# package (find_package(attnkit 0.1 CONFIG) -> attnkit::attnkit, static, and attnkit::attnkit_shared, each with
# its usage requirements: include path, OpenMP, Highway for the static library's link, the CUDA runtime when
# built), a pkg-config file (attnkit.pc), and the CLI with the case files.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ATTNKIT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/attnkit" CACHE STRING
    "Where attnkitConfig.cmake is installed, relative to the prefix")

install(TARGETS attnkit attnkit_shared EXPORT attnkit-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT devel
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/attnkit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT devel)
install(EXPORT attnkit-targets NAMESPACE attnkit:: DESTINATION ${ATTNKIT_INSTALL_CMAKEDIR} COMPONENT devel)

set(ATTNKIT_CONFIG_HAS_CUDA ${ATTNKIT_HAS_CUDA})
set(ATTNKIT_CONFIG_HAS_VULKAN ${ATTNKIT_HAS_VULKAN})
configure_package_config_file(cmake/attnkitConfig.cmake.in "${CMAKE_CURRENT_BINARY_DIR}/attnkitConfig.cmake"
                              INSTALL_DESTINATION ${ATTNKIT_INSTALL_CMAKEDIR})
# 0.x: only the same minor version is compatible (the SONAME says the same).
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/attnkitConfigVersion.cmake"
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/attnkitConfig.cmake" "${CMAKE_CURRENT_BINARY_DIR}/attnkitConfigVersion.cmake"
        DESTINATION ${ATTNKIT_INSTALL_CMAKEDIR} COMPONENT devel)

# pkg-config, relocatable (the prefix is found from the .pc file's place): -lattnkit picks the shared library
# where both are installed; --static adds what the archive needs.
set(ATTNKIT_PC_LIBS_PRIVATE "${OpenMP_CXX_FLAGS}")
set(ATTNKIT_PC_REQUIRES_PRIVATE "libhwy libhwy-contrib")
set(ATTNKIT_PC_LIBS "")
if(ATTNKIT_HAS_CUDA)  # the shared library needs the CUDA runtime found at link and run time
  set(ATTNKIT_PC_LIBS "-L${CUDAToolkit_LIBRARY_DIR} -Wl,-rpath,${CUDAToolkit_LIBRARY_DIR}")
  string(APPEND ATTNKIT_PC_LIBS_PRIVATE " -lcudart")
endif()
if(ATTNKIT_HAS_VULKAN)  # the static library's Vulkan backend links the loader
  string(APPEND ATTNKIT_PC_REQUIRES_PRIVATE " vulkan")
endif()
configure_file(cmake/attnkit.pc.in "${CMAKE_CURRENT_BINARY_DIR}/attnkit.pc" @ONLY)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/attnkit.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT devel)

if(TARGET attnkit_cli)
  install(TARGETS attnkit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
  install(DIRECTORY cases/ DESTINATION ${CMAKE_INSTALL_DATADIR}/attnkit/cases COMPONENT cli
          FILES_MATCHING PATTERN "*.json")
endif()
