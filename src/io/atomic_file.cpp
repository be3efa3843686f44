// Atomic file and directory writes with POSIX temp names, fsync and rename(2)/renameat2(2).
#include "io/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace fs = std::filesystem;

namespace qlora {

[[noreturn]] static void io_fail(const std::string& path, const std::string& what, int err) {
  fail(ErrorKind::Io, path, what + ": " + std::strerror(err),
       err == ENOENT ? "does the parent directory exist?" :
       err == EACCES || err == EPERM ? "check permissions" :
       err == ENOSPC ? "the disk is full" :
       err == EDQUOT ? "the disk quota is used up" :
       err == EFBIG ? "the file size limit is reached (ulimit -f) or the filesystem's largest file" : "");
}

static std::string parent_of(const std::string& path) {
  std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

// A rename is only durable once the directory entry itself is on disk.
static void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse to open directories
  ::fsync(fd);
  ::close(fd);
}

// Errors name `path`, and `temp` when the bytes go to a temporary file that becomes `path` on commit.
static void write_all(int fd, std::string_view bytes, const std::string& path, const std::string* temp = nullptr) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      io_fail(path, temp ? "write failed (to its temporary file " + fs::path(*temp).filename().string() + ")" : "write failed", e);
    }
    p += n;
    left -= size_t(n);
  }
}

static mode_t current_umask() {
  mode_t m = ::umask(0);  // the only portable way to read the umask is to set it
  ::umask(m);
  return m;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  std::string tmpl = path_ + ".tmp-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  fd_ = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd_ < 0) io_fail(path_, "cannot create temporary file " + tmpl, errno);
  temp_ = name.data();
  struct stat st {};
  mode_t mode = ::stat(path_.c_str(), &st) == 0 ? (st.st_mode & 07777) : (0666 & ~current_umask());
  if (::fchmod(fd_, mode) != 0) {
    int e = errno;
    ::close(fd_);
    ::unlink(temp_.c_str());
    io_fail(temp_, "cannot set file mode", e);
  }
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(temp_.c_str());
}

void AtomicFile::append(std::string_view bytes) {
  if (fd_ < 0) fail(ErrorKind::Internal, path_, "append() after commit()");
  write_all(fd_, bytes, path_, &temp_);
}

void AtomicFile::commit() {
  if (committed_) return;
  if (::fsync(fd_) != 0) io_fail(temp_, "fsync failed", errno);
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) io_fail(temp_, "close failed", errno);
  if (::rename(temp_.c_str(), path_.c_str()) != 0) io_fail(path_, "cannot rename " + temp_ + " to it", errno);
  committed_ = true;
  fsync_dir(parent_of(path_));
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.append(bytes);
  f.commit();
}

AtomicDir::AtomicDir(std::string final_path) : final_(std::move(final_path)) {
  while (final_.size() > 1 && final_.back() == '/') final_.pop_back();
  if (final_.empty()) fail(ErrorKind::Io, "AtomicDir", "empty directory path");
  std::string tmpl = final_ + ".tmp-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  if (!::mkdtemp(name.data())) io_fail(final_, "cannot create temporary directory " + tmpl, errno);
  temp_ = name.data();
  ::chmod(temp_.c_str(), 0777 & ~current_umask());  // mkdtemp makes 0700; output dirs should look normal
}

AtomicDir::~AtomicDir() {
  if (committed_ || temp_.empty()) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);  // never throw from a destructor; a leftover .tmp dir is harmless
}

std::string AtomicDir::path(const std::string& name) const { return temp_ + "/" + name; }

void AtomicDir::write(const std::string& name, std::string_view bytes) const {
  if (committed_) fail(ErrorKind::Internal, final_, "write('" + name + "') after commit()");
  std::string p = path(name);
  std::string dir = parent_of(p);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(ErrorKind::Io, dir, "cannot create directory: " + ec.message());
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) io_fail(p, "cannot create file", errno);
  try {
    write_all(fd, bytes, p);
    if (::fsync(fd) != 0) io_fail(p, "fsync failed", errno);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) io_fail(p, "close failed", errno);
}

void AtomicDir::commit() {
  if (committed_) return;
  fsync_dir(temp_);
  struct stat st {};
  if (::lstat(final_.c_str(), &st) != 0) {
    if (errno != ENOENT) io_fail(final_, "cannot stat", errno);
    if (::rename(temp_.c_str(), final_.c_str()) != 0) io_fail(final_, "cannot rename " + temp_ + " to it", errno);
  } else {
    if (!S_ISDIR(st.st_mode))
      fail(ErrorKind::Io, final_, "exists and is not a directory", "remove it or choose another output path");
    // Swap the two directories in one step, then delete the old contents (now under the temp name).
    if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) != 0) {
      int e = errno;
      if (e != EINVAL && e != ENOSYS) io_fail(final_, "cannot exchange with " + temp_, e);
      // Filesystem without RENAME_EXCHANGE: move the old one aside first (a short window without it).
      std::string old = final_ + ".old-" + std::to_string(::getpid());
      std::error_code ec;
      fs::remove_all(old, ec);
      if (::rename(final_.c_str(), old.c_str()) != 0) io_fail(final_, "cannot move aside to " + old, errno);
      if (::rename(temp_.c_str(), final_.c_str()) != 0) {
        int e2 = errno;
        ::rename(old.c_str(), final_.c_str());  // put the old one back
        io_fail(final_, "cannot rename " + temp_ + " to it", e2);
      }
      fs::remove_all(old, ec);
    } else {
      // The new directory is in place; failing to delete the old one must not turn that into an error.
      std::error_code ec;
      fs::remove_all(temp_, ec);
    }
  }
  committed_ = true;
  fsync_dir(parent_of(final_));
}

}  // namespace qlora
