#pragma once

#include <string>

// A fresh directory under /tmp for one test, removed (recursively) when destroyed. Paths stay
// short so Unix socket paths inside it fit in sun_path (108 bytes).

namespace tally::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace tally::testing
