// Atomic writes: files and directories replace their targets whole, leave no temp files, report errno.
#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "tmp_dir.h"

namespace fs = std::filesystem;
using namespace qlora;
using qlora::test::catch_error;
using qlora::test::read_bytes;
using qlora::test::TmpDir;
using qlora::test::write_bytes;

static std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

TEST(AtomicFile, WritesAndReplaces) {
  TmpDir tmp;
  write_file_atomic(tmp / "a.json", "first");
  EXPECT_EQ(read_bytes(tmp / "a.json"), "first");
  write_file_atomic(tmp / "a.json", std::string("second\0x", 8));  // binary-safe
  EXPECT_EQ(read_bytes(tmp / "a.json"), std::string("second\0x", 8));
  EXPECT_EQ(listing(tmp.path()), std::vector<std::string>{"a.json"});  // no temp files left behind
}

TEST(AtomicFile, KeepsModeOfReplacedFile) {
  TmpDir tmp;
  write_bytes(tmp / "m.txt", "old");
  ASSERT_EQ(chmod((tmp / "m.txt").c_str(), 0640), 0);
  write_file_atomic(tmp / "m.txt", "new");
  struct stat st {};
  ASSERT_EQ(stat((tmp / "m.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST(AtomicFile, UncommittedLeavesTargetUntouched) {
  TmpDir tmp;
  write_bytes(tmp / "t.bin", "original");
  {
    AtomicFile f(tmp / "t.bin");
    f.append("partial output");
    EXPECT_TRUE(fs::exists(f.temp_path()));
  }  // e.g. an exception while writing a checkpoint
  EXPECT_EQ(read_bytes(tmp / "t.bin"), "original");
  EXPECT_EQ(listing(tmp.path()), std::vector<std::string>{"t.bin"});
  {
    AtomicFile f(tmp / "t.bin");
    f.append("part 1, ");
    f.append("part 2");
    EXPECT_EQ(read_bytes(tmp / "t.bin"), "original");  // nothing visible before commit
    f.commit();
  }
  EXPECT_EQ(read_bytes(tmp / "t.bin"), "part 1, part 2");
}

TEST(AtomicFile, ErrorNamesPathAndErrno) {
  Error e = catch_error([] { write_file_atomic("/nonexistent-qlora/x.txt", "x"); }, ErrorKind::Io);
  EXPECT_EQ(e.where(), "/nonexistent-qlora/x.txt");
  EXPECT_NE(e.message().find("No such file or directory"), std::string::npos) << e.what();
}

TEST(AtomicDir, CreatesOnCommit) {
  TmpDir tmp;
  {
    AtomicDir d(tmp / "ckpt");
    d.write("adapter_config.json", "{}");
    d.write("sub/state.bin", "abc");
    EXPECT_FALSE(fs::exists(tmp / "ckpt"));
    EXPECT_TRUE(fs::is_directory(d.temp_path()));
    EXPECT_EQ(d.temp_path().rfind(tmp / "ckpt.tmp-", 0), 0u);
    d.commit();
    EXPECT_TRUE(d.committed());
  }
  EXPECT_EQ(read_bytes(tmp / "ckpt/adapter_config.json"), "{}");
  EXPECT_EQ(read_bytes(tmp / "ckpt/sub/state.bin"), "abc");
  EXPECT_EQ(listing(tmp.path()), std::vector<std::string>{"ckpt"});
}

TEST(AtomicDir, ReplacesExistingDirectory) {
  TmpDir tmp;
  fs::create_directory(tmp / "out");
  write_bytes(tmp / "out/old_only.txt", "old");
  write_bytes(tmp / "out/shared.txt", "old");
  AtomicDir d(tmp / "out/");  // trailing slash is tolerated
  write_bytes(d.path("shared.txt"), "new");  // files written by other code through path()
  d.commit();
  EXPECT_EQ(listing(tmp / "out"), std::vector<std::string>{"shared.txt"});
  EXPECT_EQ(read_bytes(tmp / "out/shared.txt"), "new");
  EXPECT_EQ(listing(tmp.path()), std::vector<std::string>{"out"});
}

TEST(AtomicDir, AbandonedDirIsRemoved) {
  TmpDir tmp;
  fs::create_directory(tmp / "out");
  write_bytes(tmp / "out/keep.txt", "keep");
  {
    AtomicDir d(tmp / "out");
    d.write("half.txt", "x");
  }
  EXPECT_EQ(listing(tmp.path()), std::vector<std::string>{"out"});
  EXPECT_EQ(listing(tmp / "out"), std::vector<std::string>{"keep.txt"});
}

TEST(AtomicDir, Errors) {
  TmpDir tmp;
  write_bytes(tmp / "file", "x");
  AtomicDir d(tmp / "file");
  Error e = catch_error([&] { d.commit(); }, ErrorKind::Io);
  EXPECT_NE(e.message().find("not a directory"), std::string::npos);
  EXPECT_EQ(read_bytes(tmp / "file"), "x");
  e = catch_error([] { AtomicDir bad("/nonexistent-qlora/out"); }, ErrorKind::Io);
  EXPECT_NE(e.message().find("No such file or directory"), std::string::npos) << e.what();
}
