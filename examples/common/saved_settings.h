// How a resume takes the saved values of the options its command line leaves
// out: each checkpoint records the run's settings as text
// (train/run_settings.h), some of them composite ("sgd momentum=0.9
// weight_decay=0", "StepLR(gamma=0.5, step_size=4)"), and each option left
// out reads its value back from the setting, or the part of one, that
// recorded it. So `--checkpoint-dir DIR --resume` alone continues a run as
// it was, and an option given on the command line still wins (a fixed
// setting that then differs is refused by record_run_settings).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "lockstep/train/run_settings.h"

namespace examples {

class SavedSettings {
 public:
  // `given`: the options the command line set, by name ("batch_size").
  SavedSettings(const lockstep::train::RunSettings& saved, const std::set<std::string>& given)
      : saved_(saved), given_(given) {}

  // The text of the setting `setting` (fixed or changeable), or of its part
  // `part` ("" for its head: "sgd", "StepLR"), when `option` was left out and
  // the checkpoint records it.
  std::optional<std::string> text(const std::string& option, const std::string& setting,
                                  const std::optional<std::string>& part = std::nullopt) const;
  // Sets `value` from that text (a string as it is, a bool from on/off, a
  // number parsed whole) and says whether it did; a text that does not parse
  // throws, naming the option.
  template <class T>
  bool take(const std::string& option, const std::string& setting, T& value,
            const std::optional<std::string>& part = std::nullopt) const {
    const auto t = text(option, setting, part);
    if (t) value = parse<T>(option, setting, *t);
    return t.has_value();
  }

  // A composite setting's head and its name=value parts.
  struct Parts {
    std::string head;
    std::map<std::string, std::string> values;
  };
  static Parts parts(const std::string& text);

 private:
  template <class T>
  static T parse(const std::string& option, const std::string& setting, const std::string& text);

  const lockstep::train::RunSettings& saved_;
  const std::set<std::string>& given_;
};

}  // namespace examples
