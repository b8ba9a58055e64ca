# Install and export: headers under include/ember, libember, and a CMake package so that another project can
#   find_package(ember) and target_link_libraries(app PRIVATE ember::ember).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS ember EXPORT emberTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/ember/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ember
  FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
install(EXPORT emberTargets NAMESPACE ember:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ember)

set(EMBER_INSTALLED_WITH_CUDA ${EMBER_WITH_CUDA})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/emberConfig.cmake.in
  ${PROJECT_BINARY_DIR}/emberConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ember)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/emberConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/emberConfig.cmake ${PROJECT_BINARY_DIR}/emberConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ember)
