// Default AddressSanitizer options, and dlclose kept from unloading, in every executable of a
// DPTRAIN_SANITIZE build.
//
// The sanitizer runtimes of GCC 12 and clang 14 (Debian 12; fixed in GCC 14 and LLVM 17) intercept
// __tls_get_addr and take any dynamic TLS block that starts 16 bytes into a page for a glibc < 2.25
// block with a header, reading the two words before it as that block's bounds. Since glibc 2.25
// there is no header, so the bounds are garbage whenever a block lands there by chance, and
// LeakSanitizer's stop-the-world tracer segfaults at exit ("Tracer caught signal 11"), with no leak
// found. Open MPI's dlopen'ed components make dynamic TLS blocks in every rank, so 4-rank tests
// failed now and then. Without the interceptor LeakSanitizer still scans static TLS and every
// thread's stack; scanning fewer roots can only add leak reports, never hide one, and the test
// suites run clean with it. ASAN_OPTIONS in the environment is parsed after this and can still
// override it.
extern "C" const char* __asan_default_options();
extern "C" const char* __asan_default_options() {
  return "intercept_tls_get_addr=0";
}

// Open MPI dlclose()s its components in MPI_Finalize, while what they allocated in MPI_Init is still
// live. LeakSanitizer then finds those blocks unreferenced (the components' globals are unmapped) and
// must symbolize every one of them to match tests/lsan.supp, with their innermost frames in modules
// that no longer exist: about one second per rank at every exit, 40% of the sanitizer build's
// end-to-end tests. Kept mapped, the components' globals still point at their blocks, which are no
// leak. Nothing of ours unloads a library; the program's end unmaps everything anyway.
extern "C" int dlclose(void* handle);
extern "C" int dlclose(void*) {
  return 0;
}
