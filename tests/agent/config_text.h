#pragma once

// Applies an agent config file's text, as tally-agent reads it: written to DIR/agent.toml.

#include <fstream>
#include <string>

#include "agent/config.h"
#include "tests/support/temp_dir.h"

namespace tally::agent::test_support {

inline Status applyText(const testing::TempDir& dir, const std::string& text, AgentConfig* config) {
  const std::string path = dir.file("agent.toml");
  std::ofstream(path, std::ios::trunc) << text;
  return applyConfigFile(path, config);
}

}  // namespace tally::agent::test_support
