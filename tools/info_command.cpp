// `ember info`: the version, build options, host and CUDA devices, and the effective EMBER_ALLOC_CONF
// (ember/train/system_info.h) as a few readable lines, or one JSON line with --json (keys in docs/cli.md).
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "ember/base/error.h"
#include "ember/train/system_info.h"
#include "tools/commands.h"

namespace ember::tools {

void add_info_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("info", "version, build options, devices and their memory, EMBER_ALLOC_CONF");
  cmd->add_flag("--json", *json, "print one JSON line");
  cmd->callback([json] {
    // Anything that goes wrong while probing or printing is one "ember: ..." line (exit 1), never an abort.
    std::string text;
    try {
      const train::SystemInfo s = train::system_info();
      text = *json ? s.to_json() : s.to_string();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      EMBER_THROW(Error, "info: ", e.what());
    }
    std::printf("%s\n", text.c_str());
  });
}

}  // namespace ember::tools
