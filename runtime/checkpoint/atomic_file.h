// Atomic file replacement: readers see the old file or the complete new one,
// never a partial write, even when the writer is killed or the machine loses
// power mid-write.
//
// write_file_atomically(path, fill):
//   1. fill() writes "<dir>/.<name>.tmp-<pid>-<n>", created in the same
//      directory so that the rename below stays within one filesystem;
//   2. fsync of the temporary file (its data is on disk before its name is);
//   3. rename over `path` (atomic on POSIX filesystems);
//   4. fsync of the directory (the rename itself is on disk).
// On any error the temporary file is removed and the error rethrown. A killed
// writer leaves its temporary file behind: the next write of the same path
// removes it (a file saved again after every restart keeps no partial copy of
// each killed save), remove_stale_temp_files() removes a whole directory's,
// and is_temp_file_name() lets directory listings skip them.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::runtime {

// fill(fd, temp_path) writes the content to fd (a new, empty file).
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(int fd, const std::string& temp_path)>& fill);

// True for names write_file_atomically uses for its temporary files.
bool is_temp_file_name(std::string_view name);

// Removes the temporary files in `dir` whose writer process no longer runs
// on this host (checked by pid; a zombie, exited but not yet reaped by its
// parent, counts as gone; a file with this process's pid that it is not
// writing was left by an earlier process with that pid, as in a restarted
// container); returns their paths. A writer holds a lock on its file until
// the rename (an open file description's, which the kernel drops when the
// writer ends), so where the file system has locks, the file of a writer
// whose pid this process cannot see (on another node, in another container's
// pid namespace: an evaluator beside a job) stays.
std::vector<std::filesystem::path> remove_stale_temp_files(const std::filesystem::path& dir);

// Throws lockstep::Error naming `dir` and the system's reason unless this
// process can create files in it (tried with a temporary file, removed at
// once): a read-only or foreign directory fails here, not at the first write.
void check_can_create_files(const std::filesystem::path& dir);

// check_can_create_files for the directory `path` would be written in, after
// refusing a `path` that names a directory ("runs/" or an existing one),
// which the final rename could not replace. write_file_atomically refuses
// one too.
void check_can_write_file(const std::filesystem::path& path);

// fsync of a directory, so that renames and unlinks in it are durable.
void fsync_directory(const std::filesystem::path& dir);

}  // namespace lockstep::runtime
