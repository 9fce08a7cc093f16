#pragma once
// Python's str semantics over UTF-8: templates index, slice, strip and case-map by code point, and
// print floats and reprs exactly as CPython does, because prompts must match transformers byte for byte.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qinfer::jinja::py {

std::u32string decode(std::string_view utf8);  // invalid bytes become U+FFFD (inputs are validated earlier)
std::string encode(std::u32string_view text);
size_t length(std::string_view utf8);          // in code points, as len() counts

bool is_space(char32_t c);  // str.isspace(), also what regex \s and rstrip() use
bool is_printable(char32_t c);
bool is_cased(char32_t c);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()

// strip/lstrip/rstrip; `chars` unset means whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// split/rsplit; `sep` unset means runs of whitespace. maxsplit < 0 means no limit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                               bool from_right);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
int64_t count(std::string_view s, std::string_view sub);
// find/rfind in code points, -1 when absent.
int64_t find(std::string_view s, std::string_view sub, bool from_right);

bool is_lower(std::string_view s);
bool is_upper(std::string_view s);
bool is_digit(std::string_view s);
bool is_alpha(std::string_view s);
bool is_alnum(std::string_view s);
bool is_all_space(std::string_view s);

std::string repr(std::string_view s);  // repr() of a str, quotes included
std::string float_repr(double v);      // repr() of a float: shortest round-trip, Python's layout
std::string html_escape(std::string_view s);

// Python slice start:stop:step over a sequence of `size` elements: the indices it selects.
std::vector<int64_t> slice_indices(int64_t size, std::optional<int64_t> start, std::optional<int64_t> stop,
                                   std::optional<int64_t> step);

}  // namespace qinfer::jinja::py
