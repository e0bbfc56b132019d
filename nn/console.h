// What the user sees on the terminal: whether the launcher's output reaches one, and lines on
// standard error that do not run into rank 0's live progress line.
#pragma once
#include <string>
#include <string_view>

namespace rt {

// "/proc/<parent>/fd/<fd>": under mpirun a rank's output goes through the launcher (its parent),
// whose descriptor is the user's terminal or file.
std::string launcher_fd(int fd);

// Whether this process's descriptor fd (1 or 2) reaches a terminal. Under mpirun what counts is
// the launcher's: Open MPI hands each rank a pseudo-terminal for its standard output even when
// mpirun's own output is a pipe or a file.
bool reaches_terminal(int fd);

// The bytes stderr_line writes for `line`: the line and a newline, led by "\r\033[K" (back to
// the start of the terminal's line, cleared) when `clear` is set.
std::string stderr_text(std::string_view line, bool clear);

// Whether this process's standard output reaches a terminal (through the launcher: a rank's own
// pseudo-terminal alone does not count). Rank 0's live progress line is drawn only then.
bool stdout_is_terminal();

// Made-folder bookkeeping, for files a job may leave behind when refused at start: the outermost
// folder of `dir` that does not exist yet ("" when none), and, given it, the removal of `dir` and
// its parents up to it, each only while empty.
std::string first_missing_folder(const std::string& dir);
void remove_made_folders(const std::string& dir, const std::string& made);

// What stderr_line puts before its lines: "\r\033[K" where standard output and standard error
// both reach the terminal, else "". Fixed at the first call; a signal handler may write it
// (async-signal-safe) once it has been called before the handler is installed.
const char* stderr_line_prefix();

// Writes `line` and a newline to standard error at once. Where standard output and standard error
// both reach the terminal, rank 0's live progress line may be open on it, with no newline yet:
// any rank's message would continue its text. The line then starts by clearing it; the next
// progress update draws it again below the message.
void stderr_line(std::string_view line);

}  // namespace rt
