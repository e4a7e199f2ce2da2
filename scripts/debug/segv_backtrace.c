// LD_PRELOAD=segv_backtrace.so: on SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT,
// prints the native stack as "segv-frame: OBJECT+0xOFFSET" lines (the offset
// inside each shared object, for addr2line -f -C -i -e OBJECT OFFSET), then
// dies of the same signal. For machines without gdb (the lent GPU machine).
//   gcc -shared -fPIC -O1 -o /tmp/segv_backtrace.so scripts/debug/segv_backtrace.c
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void on_fault(int sig, siginfo_t* info, void* uctx) {
  (void)uctx;
  void* frames[64];
  const int n = backtrace(frames, 64);
  fprintf(stderr, "segv-signal: %d (%s) at address %p\n", sig, strsignal(sig), info ? info->si_addr : NULL);
  for (int i = 0; i < n; ++i) {
    Dl_info d;
    if (dladdr(frames[i], &d) && d.dli_fname) {
      fprintf(stderr, "segv-frame: %s+0x%lx %s\n", d.dli_fname,
              (unsigned long)((char*)frames[i] - (char*)d.dli_fbase), d.dli_sname ? d.dli_sname : "?");
    } else {
      fprintf(stderr, "segv-frame: ?+%p\n", frames[i]);
    }
  }
  fflush(stderr);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; ++i) sigaction(sigs[i], &sa, NULL);
}
