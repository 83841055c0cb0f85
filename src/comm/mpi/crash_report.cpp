#include "comm/mpi/crash_report.hpp"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace meshtrain {

namespace {

// Everything below runs inside the signal handler: write(2) only, no allocation, no stdio.
// dladdr is not on POSIX's async-signal-safe list but only reads the loader's link map; a
// process that is dying anyway accepts that risk for the library names it gives.
char g_prefix[160];
constexpr size_t kAltStack = 64 * 1024;
alignas(64) char g_alt_stack[kAltStack];

void put(const char* s) {
  const ssize_t rc = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)rc;
}

void put_hex(uintptr_t v) {
  char buf[2 + 16 + 1];
  char* p = buf + sizeof(buf) - 1;
  *p = '\0';
  do {
    *--p = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  *--p = 'x';
  *--p = '0';
  put(p);
}

void put_dec(long v) {
  char buf[24];
  char* p = buf + sizeof(buf) - 1;
  *p = '\0';
  const bool neg = v < 0;
  unsigned long u = neg ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
  do {
    *--p = char('0' + u % 10);
    u /= 10;
  } while (u);
  if (neg) *--p = '-';
  put(p);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    default: return "signal";
  }
}

// "LIB+0xOFF (symbol+0xOFF)" when addr lies in a loaded object; false otherwise.
bool put_location(uintptr_t addr) {
  Dl_info info{};
  if (addr == 0 || !dladdr(reinterpret_cast<void*>(addr), &info) || !info.dli_fname) return false;
  put(info.dli_fname);
  put("+");
  put_hex(addr - reinterpret_cast<uintptr_t>(info.dli_fbase));
  if (info.dli_sname) {
    put(" (");
    put(info.dli_sname);
    put("+");
    put_hex(addr - reinterpret_cast<uintptr_t>(info.dli_saddr));
    put(")");
  }
  return true;
}

void put_line(const char* what, uintptr_t value) {
  put(g_prefix);
  put(what);
  put_hex(value);
  put(" ");
  if (!put_location(value)) put("(not in a loaded object)");
  put("\n");
}

extern "C" void on_fatal_signal(int sig, siginfo_t* si, void* context) {
  put(g_prefix);
  put("fatal signal ");
  put_dec(sig);
  put(" (");
  put(signal_name(sig));
  put("), si_code ");
  put_dec(si->si_code);
  put(", fault address ");
  put_hex(reinterpret_cast<uintptr_t>(si->si_addr));
  put("\n");
#if defined(__x86_64__)
  const auto* uc = static_cast<const ucontext_t*>(context);
  const auto pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  const auto sp = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
  put_line("pc ", pc);
  if (sp && sp % sizeof(uintptr_t) == 0) {
    // After `call *%reg` with a null target the pc is 0 and the caller's return address is the
    // word at sp; in code without frame pointers the other return addresses are stack words too.
    put_line("word at sp (the caller, if pc is 0) ", *reinterpret_cast<const uintptr_t*>(sp));
  }
#endif
  // glibc's backtrace before the stack scan: the scan reads 2 KiB above sp, which could reach
  // past the top of a thread's stack and end the report early.
  void* frames[64];
  const int n = backtrace(frames, 64);
  put(g_prefix);
  put("backtrace:\n");
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
#if defined(__x86_64__)
  if (sp && sp % sizeof(uintptr_t) == 0) {
    constexpr int kWords = 256;
    for (int i = 1; i < kWords; ++i) {
      const uintptr_t w = reinterpret_cast<const uintptr_t*>(sp)[i];
      Dl_info info{};
      if (w < 4096 || !dladdr(reinterpret_cast<void*>(w), &info) || !info.dli_fname || !info.dli_sname) continue;
      put(g_prefix);
      put("  stack word sp+");
      put_dec(long(i * sizeof(uintptr_t)));
      put(": ");
      put_location(w);
      put("\n");
    }
  }
#else
  (void)context;
#endif
  // SA_RESETHAND restored the default action: returning re-executes the faulting instruction and
  // the process dies by the same signal, as it would have without this report.
}

}  // namespace

void install_crash_report(const std::string& prefix) {
  const size_t n = std::min(prefix.size(), size_t(150));
  std::memcpy(g_prefix, prefix.data(), n);
  g_prefix[n] = '\0';
  // backtrace() loads libgcc_s on first use (malloc, dlopen): do that now, not in the handler.
  void* warm[1];
  backtrace(warm, 1);
  stack_t ss{};
  ss.ss_sp = g_alt_stack;
  ss.ss_size = kAltStack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) sigaction(sig, &sa, nullptr);
}

}  // namespace meshtrain
