# The kernel sources of fusedopt_core: every file of src/cpu/, one per algorithm (src/cpu/<algo>.cc,
# defining the entry points its descriptor header declares) and the shared passes. A glob, so that
# an algorithm's kernel is added by adding its file; CONFIGURE_DEPENDS re-runs the glob at build
# time, so a new file needs no manual re-configure.
file(GLOB FOPT_KERNEL_SOURCES CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}
     ${PROJECT_SOURCE_DIR}/src/cpu/*.cc)
