// The one error convention of every op: fail(op, parts...) throws std::runtime_error
// "<op>: <parts...>", naming the argument and what was expected, before any launch.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace fattn {

// Message pieces as text without iostreams: a library built with a newer libstdc++ than
// the one torch's process loads crashes on its first formatted number through an
// ostream (the locale facets differ), so numbers go through to_string/snprintf.
inline std::string to_text(const char* s) { return s; }
inline std::string to_text(const std::string& s) { return s; }
template <typename T>
std::string to_text(T value) {
  static_assert(std::is_arithmetic_v<T>, "fail(): pass strings or numbers");
  if constexpr (std::is_floating_point_v<T>) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%g", static_cast<double>(value));
    return buffer;
  } else {
    return std::to_string(value);
  }
}

template <typename... Parts>
[[noreturn]] void fail(const char* op, const Parts&... parts) {
  std::string message = std::string(op) + ": ";
  ((message += to_text(parts)), ...);
  throw std::runtime_error(message);
}

}  // namespace fattn
