// The HTTP listener's settings (agent/config.h): http_socket, http_listen, their defaults and
// their refusals.

#include <gtest/gtest.h>

#include <string>

#include "agent/config.h"
#include "tests/agent/config_text.h"
#include "tests/support/temp_dir.h"

namespace tally::agent {
namespace {

using testing::TempDir;

using test_support::applyText;

TEST(AgentHttpConfigTest, TheHttpSocketSitsBesideTheNativeOneByDefault) {
  AgentConfig config;
  EXPECT_EQ(httpSocketPath(config), "/run/tally/agent-http.sock");
  config.socket_path = "/tmp/t/agent1.sock";
  EXPECT_EQ(httpSocketPath(config), "/tmp/t/agent1-http.sock");
  config.socket_path = "/tmp/t/gw";
  EXPECT_EQ(httpSocketPath(config), "/tmp/t/gw-http");
  EXPECT_FALSE(config.http_tcp_enabled);
}

TEST(AgentHttpConfigTest, ReadsHttpSocketAndListen) {
  TempDir dir;
  AgentConfig config;
  ASSERT_TRUE(applyText(dir,
                        "http_socket = \"/srv/gw/http.sock\"\n"
                        "http_listen = \"127.0.0.1:8089\"\n",
                        &config)
                  .isOk());
  EXPECT_EQ(httpSocketPath(config), "/srv/gw/http.sock");
  EXPECT_TRUE(config.http_tcp_enabled);
  EXPECT_EQ(config.http_tcp_host, "127.0.0.1");
  EXPECT_EQ(config.http_tcp_port, 8089);
}

TEST(AgentHttpConfigTest, ReadsTheTimeoutsAndRefusesZero) {
  TempDir dir;
  AgentConfig config;
  EXPECT_EQ(config.http_header_timeout_ms, 10'000u);
  EXPECT_EQ(config.http_idle_timeout_ms, 60'000u);
  EXPECT_EQ(config.http_linger_ms, 5'000u);
  ASSERT_TRUE(applyText(dir,
                        "http_header_timeout_ms = 250\n"
                        "http_idle_timeout_ms = 30000\n"
                        "http_linger_ms = 100\n",
                        &config)
                  .isOk());
  EXPECT_EQ(config.http_header_timeout_ms, 250u);
  EXPECT_EQ(config.http_idle_timeout_ms, 30'000u);
  EXPECT_EQ(config.http_linger_ms, 100u);
  const Status status = applyText(dir, "http_idle_timeout_ms = 0\n", &config);
  EXPECT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("http_idle_timeout_ms"), std::string::npos) << status.message();
}

TEST(AgentHttpConfigTest, EmptyStringsDisableEither) {
  TempDir dir;
  AgentConfig config;
  ASSERT_TRUE(applyHttpListen("127.0.0.1:0", &config).isOk());
  ASSERT_TRUE(applyText(dir, "http_socket = \"\"\nhttp_listen = \"\"\n", &config).isOk());
  EXPECT_EQ(httpSocketPath(config), "");
  EXPECT_FALSE(config.http_tcp_enabled);
}

TEST(AgentHttpConfigTest, RefusesANonLoopbackListenAndBadTypesNamingTheKey) {
  TempDir dir;
  AgentConfig config;
  Status status = applyText(dir, "http_listen = \"0.0.0.0:8080\"\n", &config);
  EXPECT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("http_listen"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("loopback"), std::string::npos) << status.message();
  EXPECT_FALSE(applyHttpListen("10.0.0.1:80", &config).isOk());
  EXPECT_TRUE(applyHttpListen("[::1]:80", &config).isOk());
  status = applyText(dir, "http_socket = 7\n", &config);
  EXPECT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("http_socket"), std::string::npos) << status.message();
}

TEST(AgentHttpConfigTest, ValidateRefusesAnHttpSocketOnTheNativePathOrTooLong) {
  AgentConfig config;
  config.data_dir = "/tmp/d";
  config.http_socket_path = config.socket_path;
  EXPECT_FALSE(validateConfig(config).isOk());
  config.http_socket_path = "/tmp/" + std::string(110, 'x');
  EXPECT_FALSE(validateConfig(config).isOk());
  config.http_socket_path = "";
  EXPECT_TRUE(validateConfig(config).isOk());
}

}  // namespace
}  // namespace tally::agent
