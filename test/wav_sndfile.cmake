# test_wav reads the files common/wav.c writes back with libsndfile, a reader
# independent of ours (libsndfile1-dev, installed by scripts/install-deps.sh).
pkg_check_modules(SNDFILE REQUIRED IMPORTED_TARGET sndfile)
target_link_libraries(test_wav PRIVATE PkgConfig::SNDFILE)
# test_api_audio decodes the MP3 and Ogg Opus answers back with it (libmpg123, libopus).
target_link_libraries(test_api_audio PRIVATE PkgConfig::SNDFILE)
