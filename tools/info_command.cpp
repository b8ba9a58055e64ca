// `ember info`: the version, build options, host and CUDA devices, and the effective EMBER_ALLOC_CONF
// (ember/train/system_info.h) as a few readable lines, or one JSON line with --json (keys in docs/cli.md).
#include <cstdio>
#include <memory>

#include "ember/train/system_info.h"
#include "tools/commands.h"

namespace ember::tools {

void add_info_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("info", "version, build options, devices and their memory, EMBER_ALLOC_CONF");
  cmd->add_flag("--json", *json, "print one JSON line");
  cmd->callback([json] {
    const train::SystemInfo s = train::system_info();
    std::printf("%s\n", *json ? s.to_json().c_str() : s.to_string().c_str());
  });
}

}  // namespace ember::tools
