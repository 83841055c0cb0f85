#pragma once
/// @file A fatal-signal report per rank. Open MPI's own handler prints "Failing at address" and
/// a glibc backtrace, which stops at the signal frame when the faulting code has no unwind
/// information — in particular after a call through a null function pointer (pc = 0), the one
/// case where the caller is still known: the call pushed its return address at the stack pointer.
/// This report names the rank and host, the signal, the fault address, the pc, the word at the
/// stack pointer and every stack word that points into loaded code (library + offset, and the
/// nearest exported symbol: `addr2line -e LIB OFFSET` then names the line), then the glibc
/// backtrace. The process still dies by the same signal (core dump and the launcher's
/// "Segmentation fault" line included).
#include <string>

namespace meshtrain {

/// Installs the report for SIGSEGV, SIGBUS, SIGILL and SIGFPE on an alternate signal stack
/// (a stack overflow is reported too), replacing the handler MPI_Init installed; every line
/// starts with `prefix` (e.g. "[rank 3 node-7] "; at most 150 bytes kept). Call after MPI_Init,
/// on the main thread; calling it again only replaces the prefix. Throws nothing; a failing
/// sigaction leaves the previous handler.
void install_crash_report(const std::string& prefix);

}  // namespace meshtrain
