#include "lockstep/runtime/checkpoint/safetensors_header.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "lockstep/runtime/checkpoint/metadata_text.h"

namespace lockstep::runtime {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; lockstep writes its memory as is");

namespace {

struct DTypeName {
  DType dtype;
  std::string_view name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::f64, "F64"}, {DType::f32, "F32"}, {DType::f16, "F16"}, {DType::bf16, "BF16"},
    {DType::i64, "I64"}, {DType::i32, "I32"}, {DType::u8, "U8"},   {DType::boolean, "BOOL"},
};

// The JSON of a string, quotes and escapes included (`s` is UTF-8:
// check_utf8 first).
std::string quoted(const std::string& s) { return nlohmann::json(s).dump(); }

// JSON strings are UTF-8 (nlohmann's dump() throws a bare type_error 316 on
// anything else): an error naming `what` ("tensor name 'x'", "metadata
// 'k'"), the byte and where it is, and what to do.
void check_utf8(const std::string& s, const std::string& what, const char* fix) {
  const size_t good = utf8_prefix_length(s);
  if (good == s.size()) return;
  throw Error(fmt::format("safetensors: {} is not UTF-8 text (byte 0x{:02x} at offset {} of "
                          "\"{}\"); the header is JSON, whose strings must be UTF-8: {}",
                          what, static_cast<unsigned char>(s[good]), good, escape_bytes(s), fix));
}

// Thrown by KeyScan for a key an object already has.
struct DuplicateKey {
  std::string key;
  bool top_level = true;  // a tensor name (or "__metadata__"), else a key inside one's object
};

// SAX events of a header: throws DuplicateKey for a key its object already
// has, and keeps the top-level object's keys in the document's order.
struct KeyScan : nlohmann::json_sax<nlohmann::json> {
  std::vector<std::string> top_keys;
  std::vector<std::unordered_set<std::string>> open;  // the keys of each open object
  int depth = 0;                                      // open objects and arrays

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    ++depth;
    open.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    const bool top_level = depth == 1;
    if (!open.back().insert(k).second) throw DuplicateKey{k, top_level};
    if (top_level) top_keys.push_back(k);
    return true;
  }
  bool end_object() override {
    --depth;
    open.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    ++depth;
    return true;
  }
  bool end_array() override {
    --depth;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception&) override {
    return false;
  }
};

// Bytes of `shape` elements of `dtype`; false when the count overflows.
bool shape_bytes(const Shape& shape, DType dtype, uint64_t& out) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  out = n;
  return true;
}

// One tensor entry of the header; throws naming the file and the tensor.
TensorEntry decode_entry(const std::string& name, const nlohmann::json& v,
                         const std::string& file) {
  const auto bad = [&](const std::string& what) {
    return Error(
        fmt::format("{}: tensor '{}' in the safetensors header: {}; the file is corrupt "
                    "or not a safetensors file",
                    file, name, what));
  };
  if (!v.is_object()) throw bad(fmt::format("expected an object, found {}", v.dump()));
  TensorEntry e;
  e.name = name;

  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) throw bad("no \"dtype\" string");
  auto dtype = dtype_from_safetensors(dt->get<std::string>());
  if (!dtype)
    throw Error(
        fmt::format("{}: tensor '{}' has safetensors dtype {}, which lockstep does not "
                    "support (supported: F64, F32, F16, BF16, I64, I32, U8, BOOL); "
                    "convert it before loading",
                    file, name, dt->get<std::string>()));
  e.dtype = *dtype;

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) throw bad("no \"shape\" array");
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{1} << 62)
      throw bad(fmt::format("shape {} has an entry that is not a size", sh->dump()));
    e.shape.push_back(d.get<int64_t>());
  }

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    throw bad("no \"data_offsets\" pair of byte offsets");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.end < e.begin)
    throw bad(fmt::format("data_offsets [{}, {}] end before they begin", e.begin, e.end));

  uint64_t expected = 0;
  if (!shape_bytes(e.shape, e.dtype, expected))
    throw bad(fmt::format("shape {} is too large", shape_str(e.shape)));
  if (e.nbytes() != expected)
    throw bad(fmt::format("shape {} of {} needs {} bytes, data_offsets [{}, {}] hold {}",
                          shape_str(e.shape), safetensors_dtype(e.dtype), expected, e.begin, e.end,
                          e.nbytes()));
  return e;
}

}  // namespace

std::string_view safetensors_dtype(DType dtype) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == dtype) return d.name;
  throw Error(fmt::format("safetensors: no name for dtype {}", dtype_name(dtype)));
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& d : kDTypeNames)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

std::string encode_safetensors_header(const std::vector<TensorEntry>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  // Written by hand rather than through a json object: the tensors must stay
  // in data order (nlohmann's json sorts keys), and a name seen twice is an
  // error rather than a silent overwrite.
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      check_utf8(k, fmt::format("the metadata key '{}'", escape_bytes(k)),
                 "rename it");
      check_utf8(v, fmt::format("the value of metadata '{}'", escape_bytes(k)),
                 "store the bytes escaped (runtime::escape_bytes) or as text");
      if (!first) json += ',';
      json += quoted(k) + ':' + quoted(v);
      first = false;
    }
    json += "}";
  }
  uint64_t offset = 0;
  std::map<std::string_view, int> seen;
  for (const auto& t : tensors) {
    LOCKSTEP_CHECK(t.name != "__metadata__",
                   "safetensors: '__metadata__' is reserved, rename the tensor");
    check_utf8(t.name, fmt::format("the tensor name '{}'", escape_bytes(t.name)),
               "rename the tensor");
    LOCKSTEP_CHECK(++seen[t.name] == 1,
                   "safetensors: tensor name '{}' appears twice; names must be unique", t.name);
    uint64_t nbytes = 0;
    LOCKSTEP_CHECK(shape_bytes(t.shape, t.dtype, nbytes), "safetensors: tensor '{}' is too large",
                   t.name);
    std::string shape;
    for (size_t i = 0; i < t.shape.size(); ++i)
      shape += fmt::format("{}{}", i ? "," : "", t.shape[i]);
    json += fmt::format("{}{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                        json.size() > 1 ? "," : "", quoted(t.name), safetensors_dtype(t.dtype),
                        shape, offset, offset + nbytes);
    offset += nbytes;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');

  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

SafetensorsHeader decode_safetensors_header(std::string_view json, const std::string& file) {
  // nlohmann's lexer takes a NUL byte for the end of the input: "{}\0junk"
  // would parse. JSON has no place for one outside a string, where it is
  // written \u0000, nor does the padding (spaces).
  if (const size_t nul = json.find('\0'); nul != std::string_view::npos)
    throw Error(fmt::format("{}: the safetensors header holds a NUL byte at byte {} of the "
                            "file; the file is corrupt or not a safetensors file",
                            file, 8 + nul));
  // A first pass over the events alone refuses a key an object already has
  // (the DOM would silently keep one: two tensors of one name) and lists the
  // tensor names in the document's order, which breaks ties between a
  // zero-byte tensor and its neighbour at the same offset; the second builds
  // the DOM. Both are O(n log n) in the number of tensors: nlohmann's
  // ordered_json finds a key by a linear search, and its callback parser scans
  // the parent object at the end of each child, so either made reading the
  // header of a model of 20,000 tensors quadratic (seconds).
  KeyScan scan;
  nlohmann::json root;
  try {
    // A syntax error stops the scan early; parse() below throws it, saying where.
    nlohmann::json::sax_parse(json.begin(), json.end(), &scan);
    root = nlohmann::json::parse(json.begin(), json.end());
  } catch (const DuplicateKey& d) {
    throw Error(fmt::format(
        "{}: the safetensors header {} \"{}\" twice; {} (a reader would keep one of them "
        "silently): the file is corrupt or was not written by a safetensors writer",
        file, d.top_level ? "names" : "has a key", escape_bytes(d.key),
        d.top_level ? "the names of its tensors (and __metadata__) must be unique"
                    : "the keys of one object must be unique"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(
        fmt::format("{}: the safetensors header (bytes 8 to {}) is not valid JSON ({}); "
                    "the file is corrupt or not a safetensors file",
                    file, 8 + json.size(), e.what()));
  }
  LOCKSTEP_CHECK(root.is_object(),
                 "{}: the safetensors header is not a JSON object; the file is corrupt or not a "
                 "safetensors file",
                 file);

  SafetensorsHeader h;
  h.header_bytes = json.size();
  for (const std::string& key : scan.top_keys) {
    const nlohmann::json& value = root.at(key);
    if (key != "__metadata__") {
      h.tensors.push_back(decode_entry(key, value, file));
      continue;
    }
    // safetensors' own reader takes null as no metadata; some writers emit it.
    if (value.is_null()) continue;
    LOCKSTEP_CHECK(value.is_object(),
                   "{}: \"__metadata__\" in the safetensors header is {}, not an object of "
                   "strings",
                   file, value.dump());
    for (const auto& [mk, mv] : value.items()) {
      LOCKSTEP_CHECK(mv.is_string(),
                     "{}: metadata '{}' is {}, safetensors metadata values are strings", file, mk,
                     mv.dump());
      h.metadata[mk] = mv.get<std::string>();
    }
  }

  std::stable_sort(h.tensors.begin(), h.tensors.end(),
                   [](const TensorEntry& a, const TensorEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t expected_begin = 0;
  for (const auto& t : h.tensors) {
    LOCKSTEP_CHECK(t.begin == expected_begin,
                   "{}: tensor '{}' starts at data byte {}, expected {} (the tensors' byte ranges "
                   "must be contiguous and start at 0); the file is corrupt",
                   file, t.name, t.begin, expected_begin);
    expected_begin = t.end;
  }
  return h;
}

void check_data_size(const SafetensorsHeader& h, uint64_t file_size, const std::string& file) {
  const uint64_t want = h.file_bytes();
  if (file_size < want) {
    // Name the first tensor whose bytes are (partly) missing.
    std::string first_missing;
    for (const auto& t : h.tensors)
      if (h.data_offset() + t.end > file_size) {
        first_missing = fmt::format(", from tensor '{}' on", t.name);
        break;
      }
    throw Error(
        fmt::format("{}: truncated: the header describes {} bytes, the file has {} ({} "
                    "bytes missing{}); the write was cut off or the copy is incomplete, "
                    "use an older checkpoint or copy the file again",
                    file, want, file_size, want - file_size, first_missing));
  }
  LOCKSTEP_CHECK(file_size == want,
                 "{}: {} unexpected bytes after the data (the header describes {} bytes, the file "
                 "has {}); the file is corrupt",
                 file, file_size - want, want, file_size);
}

}  // namespace lockstep::runtime
