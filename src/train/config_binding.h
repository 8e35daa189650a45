// How each key of the config table (config_keys.cpp) reads and writes its TrainConfig member.
// Internal to src/train: parse_config walks the TOML tree through it, to_json and
// saved_train_config write and read the JSON form through it.
#pragma once
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <string>
#include <vector>

#include "train/config.h"
#include "train/config_keys.h"

namespace longtron::train {

/// Where a key's value came from, for messages.
struct KeyPlace {
  std::string at;      ///< "FILE:LINE: key" or "--set key=value": type errors
  std::string origin;  ///< "FILE: key" or "--set key=value" (config_origin): value-set errors
};

/// The TrainConfig member of one key and its TOML and JSON forms.
class KeyMember {
 public:
  virtual ~KeyMember() = default;
  /// The type column of the key table ("integer", "path", "number or fraction", ...).
  virtual const char* type_name() const = 0;
  /// Sets the member from `node`; throws Error at `place` for a wrong type or value.
  virtual void read(TrainConfig& config, const toml::node& node, const KeyPlace& place) const = 0;
  /// The member as a JSON value (to_json).
  virtual nlohmann::json write(const TrainConfig& config) const = 0;
  /// Sets the member from a saved config's JSON value; false (member unchanged) when the value's
  /// type or name does not fit.
  virtual bool read_json(TrainConfig& config, const nlohmann::json& value) const = 0;
};

/// A table of keys with a rule of its own (every other table just holds keys).
struct ConfigTable {
  const char* key;       ///< e.g. "parallel.tensor"
  const char* expected;  ///< what a non-table value is told it should be
  bool& (*given)(TrainConfig&);  ///< set to true when the table appears; nullptr: not recorded
  bool sized;            ///< an integer N means {size = N}
  bool written_when_given;  ///< to_json writes its keys only when `given` is true
};

/// The tables with a rule of their own.
const std::vector<ConfigTable>& config_tables();
/// The row of `key` (a full dotted key name), or nullptr.
const ConfigKey* find_config_key(const std::string& key);
/// The table entry of `key`, or nullptr.
const ConfigTable* find_config_table(const std::string& key);

/// Throws Error "<where>: expected <want>, got <type> (<value>)".
[[noreturn]] void wrong_type(const std::string& where, const char* want, const toml::node& node);

}  // namespace longtron::train
