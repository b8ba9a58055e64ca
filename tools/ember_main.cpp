// `ember`: the command-line front door. Exit status 0 on success, 1 on an ember error (typed, printed with its
// message), 2 on a usage error (CLI11 prints the help).
#include <cstdio>

#include "ember/base/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"ember: a C++/CUDA deep-learning framework built around GPU memory"};
  app.require_subcommand(1);
  ember::tools::add_bench_command(app);
  ember::tools::add_estimate_command(app);
  ember::tools::add_plan_command(app);
  ember::tools::add_mem_command(app);
  ember::tools::add_train_command(app);
  ember::tools::add_info_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "ember: %s\n", e.what());
    return 1;
  }
  return 0;
}
