// `ember`: the command-line front door. Exit status 0 on success, 1 on an ember error (typed, printed with its
// message) or a value a flag's check rejects, 2 on a usage error (CLI11 prints the help).
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>

#include "ember/base/error.h"
#include "ember/train/system_info.h"
#include "tools/commands.h"

namespace {

// CLI11 converts an integer flag's text with strtoll/strtoull, which saturate out of range (99999999999999999999
// became INT64_MAX steps) and, unsigned, accept a sign ("-5" wrapped to 2^64 - 5). Every integer option of every
// subcommand gets a check that its text is a whole number inside its 64-bit type first.
void guard_integer_options(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();  // "INT", "UINT", or with its checks' names after a ':'
    const bool is_unsigned = type.rfind("UINT", 0) == 0;
    const bool is_signed = !is_unsigned && type.rfind("INT", 0) == 0;
    if (!is_signed && !is_unsigned) continue;
    opt->check(CLI::Validator(
        [is_unsigned](std::string& text) -> std::string {
          const char* first = text.data();
          const char* last = first + text.size();
          std::from_chars_result r{};
          if (is_unsigned) {
            unsigned long long v = 0;
            r = first != last && *first != '-' ? std::from_chars(first, last, v)
                                                : std::from_chars_result{first, std::errc::invalid_argument};
          } else {
            long long v = 0;
            r = std::from_chars(first, last, v);
          }
          if (r.ec == std::errc::result_out_of_range)
            return text + " is out of range (" + (is_unsigned ? "0 to 2^64 - 1" : "-2^63 to 2^63 - 1") + ")";
          if (r.ec != std::errc() || r.ptr != last)
            return "'" + text + "' is not a whole number" + (is_unsigned ? " >= 0" : "");
          // CLI11 converts with base 0: "010" would be read as octal 8.
          const char* digits = first + (*first == '-' ? 1 : 0);
          if (last - digits > 1 && *digits == '0') return "'" + text + "': write the number without leading zeros";
          return {};
        },
        "", "integer range"));
  }
  for (CLI::App* sub : app.get_subcommands({})) guard_integer_options(*sub);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember: a C++/CUDA deep-learning framework built around GPU memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", ember::train::ember_version());
  ember::tools::add_bench_command(app);
  ember::tools::add_estimate_command(app);
  ember::tools::add_plan_command(app);
  ember::tools::add_mem_command(app);
  ember::tools::add_train_command(app);
  ember::tools::add_info_command(app);
  guard_integer_options(app);
  // An unknown word where the command goes: CLI11 would only say that a subcommand is required.
  std::string names;
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands({})) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known = known || (argc > 1 && sub->check_name(argv[1]));
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::fprintf(stderr, "ember: unknown command '%s' (commands: %s; ember --help)\n", argv[1], names.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ConversionError& e) {  // a value that is not of the flag's type: a bad value too
    std::fprintf(stderr, "ember: %s\n", e.what());
    return 1;
  } catch (const CLI::ValidationError& e) {  // a value a flag's check rejects: a bad value, as an ember error
    std::fprintf(stderr, "ember: %s\n", e.what());
    return 1;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "ember: %s\n", e.what());
    return 1;
  }
  return 0;
}
