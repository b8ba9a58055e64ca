// `ember train`: placeholder registration until the command lands.
#include "tools/commands.h"

namespace ember::tools {

void add_train_command(CLI::App& app) { (void)app; }

}  // namespace ember::tools
