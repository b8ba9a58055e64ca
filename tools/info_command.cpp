// `ember info`: placeholder registration until the command lands.
#include "tools/commands.h"

namespace ember::tools {

void add_info_command(CLI::App& app) { (void)app; }

}  // namespace ember::tools
