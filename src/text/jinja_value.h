// Jinja values: Python's None/bool/int/float/str/list/dict plus Undefined, namespace and callables.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace qlora::jinja {

class Value;
struct Dict;
struct Namespace;
struct Function;

using ValueList = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

// A template-level failure without a location; the evaluator adds "name:line:col".
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value {
 public:
  enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };
  // What Python object a List value stands for. jinja2's select/map/unique/items filters return
  // generators (always true, no len(), not subscriptable) and dict.keys()/values()/items() return
  // views; templates behave differently on those, so the difference is kept.
  // GeneratorError is a generator whose first step fails (jinja2's filters are lazy): its one
  // item is an Undefined holding the message, raised when it is iterated.
  enum class Seq : uint8_t { List, Tuple, Generator, GeneratorError, DictKeys, DictValues, DictItems };

  Value() = default;  // Undefined with no name
  Value(bool b) : type_(Type::Bool), v_(b) {}
  Value(int i) : type_(Type::Int), v_(int64_t{i}) {}
  Value(int64_t i) : type_(Type::Int), v_(i) {}
  Value(double f) : type_(Type::Float), v_(f) {}
  Value(std::string s) : type_(Type::String), v_(std::move(s)) {}
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}

  // `what` is jinja2's message when the value is used strictly: "'x' is undefined".
  static Value undefined(std::string what);
  static Value none();
  static Value list(ValueList items, bool tuple = false);
  static Value sequence(ValueList items, Seq kind);
  static Value dict(Dict d);
  static Value ns(std::shared_ptr<Namespace> n);
  static Value function(std::shared_ptr<const Function> f);

  // JSON objects keep their key order (ordered_json) or come sorted (json), as given.
  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::Undefined; }
  bool is_none() const { return type_ == Type::None; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_int() const { return type_ == Type::Int; }
  bool is_float() const { return type_ == Type::Float; }
  bool is_number() const { return type_ == Type::Int || type_ == Type::Float || type_ == Type::Bool; }
  bool is_string() const { return type_ == Type::String; }
  bool is_list() const { return type_ == Type::List; }  // any Seq kind
  bool is_tuple() const { return type_ == Type::List && seq_ == Seq::Tuple; }
  bool is_generator() const {
    return type_ == Type::List && (seq_ == Seq::Generator || seq_ == Seq::GeneratorError);
  }
  // A real list or tuple: indexable, sliceable, with a length.
  bool is_sequence() const { return type_ == Type::List && (seq_ == Seq::List || seq_ == Seq::Tuple); }
  Seq seq_kind() const { return seq_; }
  bool is_dict() const { return type_ == Type::Dict; }
  bool is_namespace() const { return type_ == Type::Namespace; }
  bool is_function() const { return type_ == Type::Function; }

  bool get_bool() const { return std::get<bool>(v_); }
  int64_t get_int() const;  // Int or Bool (Python's bool is an int)
  double get_number() const;  // Int, Bool or Float
  const std::string& get_string() const { return std::get<std::string>(v_); }
  const ValueList& get_list() const { return *std::get<std::shared_ptr<const ValueList>>(v_); }
  const Dict& get_dict() const { return *std::get<std::shared_ptr<const Dict>>(v_); }
  Namespace& get_namespace() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  const Function& get_function() const { return *std::get<std::shared_ptr<const Function>>(v_); }
  const std::string& undefined_what() const;

  bool truthy() const;             // Python bool(): empty str/list/dict, 0, None, Undefined are false
  std::string to_str() const;      // Python str(); Undefined -> ""
  std::string repr() const;        // Python repr()
  const char* type_name() const;   // Python type name for messages: "int", "str", "dict" ...

  // Throws TemplateError with the undefined value's message (jinja2's strict use of Undefined).
  [[noreturn]] void fail_undefined() const;

 private:
  Type type_ = Type::Undefined;
  Seq seq_ = Seq::List;
  std::variant<std::monostate, bool, int64_t, double, std::string, std::shared_ptr<const ValueList>,
               std::shared_ptr<const Dict>, std::shared_ptr<Namespace>, std::shared_ptr<const Function>>
      v_;
};

// Python dict with string keys, in insertion order. Lookups are linear: template data holds a
// handful of keys per object.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* find(std::string_view key) const;
  void set(std::string key, Value v);  // replaces in place (keeps the position) or appends
  size_t size() const { return entries.size(); }
};

// jinja2's namespace(): the one mutable object, so `set ns.x = ...` inside a loop is seen after it.
struct Namespace {
  Dict attrs;
};

struct CallArgs {
  ValueList args;
  Kwargs kwargs;
};

struct Function {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// Python ==, including 1 == 1.0 == True and deep list/dict equality.
bool values_equal(const Value& a, const Value& b);
// Python <; TemplateError for types Python cannot order. `op` and `swapped` only shape the
// message: `a > b` is evaluated as values_less(b, a, ">", true).
bool values_less(const Value& a, const Value& b, const char* op = "<", bool swapped = false);

// Python float repr: shortest round-trip digits, "1.0", "1e-05", "1e+20", "inf", "nan".
std::string py_float_repr(double f);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson filter calls it
// (ensure_ascii=False there). indent: none/int/str; separators: none or a pair of strings.
std::string to_json(const Value& v, bool ensure_ascii, const Value& indent, const Value& separators,
                    bool sort_keys);

}  // namespace qlora::jinja
