#pragma once
/// @file Typed exceptions of meshtrain. `app/` catches them, prints one line and exits with the
/// status each one names (DESIGN.md, Conventions).
#include <stdexcept>
#include <string>

namespace meshtrain {

/// Exit statuses the binary uses; scripts and Slurm requeue logic rely on them.
enum ExitStatus : int {
  kExitOk = 0,
  kExitRuntime = 1,    ///< a runtime failure (I/O, numerical, internal)
  kExitConfig = 2,     ///< bad deck, command line or input file, found before any work
  kExitComm = 3,       ///< a communication failure (dead rank, missed deadline)
  kExitPreempted = 4,  ///< saved and stopped on SIGTERM / SIGUSR1 (checkpoint issue)
  kExitNonFinite = 5,  ///< a step's loss or gradient norm was NaN / inf; the update was not applied
};

/// Bad deck, command-line override or validation rule. what() is the whole user-facing line:
/// `FILE:LINE: [section] key: what is wrong (rule)`.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad or unreadable input data (corpus, token store). what() names the file and the rule.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad or unreadable checkpoint / dump file. what() names the file and dataset.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The job was asked to stop (SIGTERM / SIGUSR1) and stopped at a step boundary, after saving a
/// checkpoint when checkpointing is enabled; app/ exits with kExitPreempted. what() says where.
class PreemptedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A step's loss or global gradient norm was NaN or inf (beyond [training] skip_nonfinite_steps
/// in a row). The optimizer step was not applied and no checkpoint was written after it; app/
/// exits with kExitNonFinite. what() names the step, the value and the first parameter whose
/// gradient is non-finite.
class NonFiniteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A collective failed or missed its deadline. what() names the collective, dimension and group.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace meshtrain
