// Default AddressSanitizer options compiled into every executable of a DPTRAIN_SANITIZE build.
//
// GCC 12's sanitizer runtime (Debian 12; fixed in GCC 14 and LLVM 17) intercepts __tls_get_addr and
// takes any dynamic TLS block that starts 16 bytes into a page for a glibc < 2.25 block with a
// header, reading the two words before it as that block's bounds. Since glibc 2.25 there is no
// header, so the bounds are garbage whenever a block lands there by chance, and LeakSanitizer's
// stop-the-world tracer segfaults at exit ("Tracer caught signal 11"), with no leak found. Open MPI's
// dlopen'ed components make dynamic TLS blocks in every rank, so 4-rank tests failed now and then.
// Without the interceptor LeakSanitizer still scans static TLS and every thread's stack; scanning
// fewer roots can only add leak reports, never hide one, and the test suites run clean with it.
// ASAN_OPTIONS in the environment is parsed after this and can still override it.
extern "C" const char* __asan_default_options();
extern "C" const char* __asan_default_options() {
  return "intercept_tls_get_addr=0";
}
