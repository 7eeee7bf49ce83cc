# test_wav reads the files common/wav.c writes back with libsndfile, a reader
# independent of ours (libsndfile1-dev, installed by scripts/install-deps.sh).
pkg_check_modules(SNDFILE REQUIRED IMPORTED_TARGET sndfile)
target_link_libraries(test_wav PRIVATE PkgConfig::SNDFILE)
