// The Python steps of a Markdown file, as a reader copies them: every ```python block and every
// command of a ```sh block that runs python or tensorboard, with the interpreter it names, the
// modules it imports and the reason it is not run when a marker says so.
//
// Contract of extract_python_steps(markdown, name):
// - A step names an interpreter of kInterpreters: Debian's /usr/bin/python3 or the Python peers'
//   venv (kPeersPrefix/bin/python, kPeersPrefix/bin/tensorboard). A ```python block names it on
//   its first line, `# Run with INTERPRETER ...`; a shell command by its first word (after
//   VAR=value words; commands split at &&, ||, ;, | and & outside quotes). A bare `python3` or
//   `tensorboard`, `pip`, or any other path is refused: that is the step that fails on a fresh
//   machine. An inline code span of the prose that is such a command (the tool and at least one
//   argument: `tensorboard` alone names the metrics sink) is held to the same rule, though not
//   run.
// - A step under /usr/bin/python3 that imports a module only the peers have is refused.
// - `<!-- readme-test: skip (REASON) -->` on a line of its own marks the next fenced block (blank
//   lines may come between) as one whose steps cannot run in a test (a download); that block
//   must hold a step. Any other `readme-test:` text is refused.
// - A fence opened and never closed is refused.
// Every refusal throws SnippetError, whose message starts with "NAME:LINE: ".
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mixtrain::test::readme {

class SnippetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The venv `bash cmake/setup-debian.sh --tests` makes, as the README spells it: a test maps this
// prefix to the venv's real place ($MIXTRAIN_PEERS_VENV, $XDG_CACHE_HOME), as a reader does.
inline constexpr std::string_view kPeersPrefix = "~/.cache/mixtrain/peers";

enum class Tool { python, tensorboard };

struct Interpreter {
  std::string_view path;
  Tool tool;
  bool peers;  // the venv's (PyPI packages), not Debian's
};

inline constexpr std::array<Interpreter, 4> kInterpreters{{
    {"/usr/bin/python3", Tool::python, false},
    {"~/.cache/mixtrain/peers/bin/python", Tool::python, true},
    {"~/.cache/mixtrain/peers/bin/python3", Tool::python, true},
    {"~/.cache/mixtrain/peers/bin/tensorboard", Tool::tensorboard, true},
}};

// Third-party modules after `bash cmake/setup-debian.sh --tests`: Debian's packages under
// /usr/bin/python3, which the venv sees too (--system-site-packages), and the venv's own PyPI
// packages (transformers brings safetensors, tokenizers and huggingface_hub).
inline const std::vector<std::string> kDebianModules = {"numpy", "torch", "torchvision"};
inline const std::vector<std::string> kPeersOnlyModules = {
    "tensorboard", "transformers", "safetensors", "tokenizers", "huggingface_hub"};

struct Step {
  int line = 0;        // 1-based: the block's fence, or the command's line
  bool block = false;  // a ```python block (else a shell command)
  const Interpreter* interpreter = nullptr;
  std::string source;  // the block's code, de-indented; or the command, comment stripped
  std::vector<std::string> modules;  // top-level modules imported, first import first
  std::string skip_reason;           // set by a readme-test marker
};

namespace detail {

inline std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

inline bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

inline std::string known_interpreters() {
  return "/usr/bin/python3 (Debian's numpy, torch, torchvision) or "
         "~/.cache/mixtrain/peers/bin/python, ~/.cache/mixtrain/peers/bin/tensorboard (the "
         "Python peers: bash cmake/setup-debian.sh --tests)";
}

inline const Interpreter* find_interpreter(std::string_view word) {
  for (const auto& i : kInterpreters)
    if (i.path == word) return &i;
  return nullptr;
}

// Whether a command's first word runs Python, TensorBoard or pip, whatever its folder.
inline bool is_python_tool(std::string_view word) {
  const auto slash = word.rfind('/');
  const std::string base(slash == std::string_view::npos ? word : word.substr(slash + 1));
  static const std::regex tool(R"((python|pip)(\d+(\.\d+)?)?|tensorboard)");
  return std::regex_match(base, tool);
}

// One command of a shell line: its raw text and its words, quotes removed.
struct Command {
  std::string raw;
  std::vector<std::string> words;
};

// Splits a shell line (continuations already joined) into commands, dropping a trailing `#`
// comment. Quotes are honoured, so a `;` inside `python3 -c "...; ..."` stays in its word.
inline std::vector<Command> shell_commands(const std::string& line) {
  std::vector<Command> out;
  Command cur;
  std::size_t cmd_begin = 0;
  std::string word;
  bool in_word = false;
  char quote = 0;
  auto end_word = [&] {
    if (in_word) cur.words.push_back(word);
    word.clear();
    in_word = false;
  };
  auto end_command = [&](std::size_t at) {
    end_word();
    cur.raw = trim(std::string_view(line).substr(cmd_begin, at - cmd_begin));
    if (!cur.words.empty()) out.push_back(std::move(cur));
    cur = Command{};
  };
  std::size_t i = 0;
  for (; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote)
        quote = 0;
      else
        word += c;
      continue;
    }
    const bool redirection =
        c == '&' && ((i > 0 && line[i - 1] == '>') || (i + 1 < line.size() && line[i + 1] == '>'));
    if (c == '\'' || c == '"') {
      in_word = true;
      quote = c;
    } else if (c == '#' && !in_word) {
      break;
    } else if (c == ' ' || c == '\t') {
      end_word();
    } else if (c == ';' || c == '|' || (c == '&' && !redirection)) {
      end_command(i);
      while (i + 1 < line.size() && (line[i + 1] == '|' || line[i + 1] == '&')) ++i;
      cmd_begin = i + 1;
    } else {
      in_word = true;
      word += c;
    }
  }
  end_command(i);
  return out;
}

// The top-level modules Python code imports (`import a.b as c, d`, `from e.f import g`).
inline void add_imports(std::string_view code, std::vector<std::string>& modules) {
  auto add = [&](std::string name) {
    name = trim(name);
    name = name.substr(0, name.find_first_of(". \t"));
    if (!name.empty() && std::find(modules.begin(), modules.end(), name) == modules.end())
      modules.push_back(name);
  };
  std::string statement;
  std::istringstream lines{std::string(code)};
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream parts(line);
    while (std::getline(parts, statement, ';')) {
      const auto s = trim(statement);
      if (starts_with(s, "import ")) {
        std::istringstream names(s.substr(7));
        std::string name;
        while (std::getline(names, name, ',')) add(name);
      } else if (starts_with(s, "from ") && !starts_with(s, "from .")) {
        add(s.substr(5));
      }
    }
  }
}

// `python -c CODE` and `python -m MODULE` of a command's words.
inline std::vector<std::string> command_imports(const Command& c) {
  std::vector<std::string> modules;
  for (std::size_t w = 1; w + 1 < c.words.size(); ++w) {
    if (c.words[w] == "-c") add_imports(c.words[w + 1], modules);
    if (c.words[w] == "-m") add_imports("import " + c.words[w + 1], modules);
  }
  return modules;
}

// The step a command is, when its first word (after VAR=value words) is a Python tool; throws
// when that tool is not one of kInterpreters. `what` names the command's place in the message.
inline std::optional<Step> command_step(const Command& c, const std::string& where,
                                        const std::string& what) {
  std::size_t first = 0;
  static const std::regex assignment(R"([A-Za-z_][A-Za-z0-9_]*=.*)");
  while (first < c.words.size() && std::regex_match(c.words[first], assignment)) ++first;
  if (first == c.words.size() || !is_python_tool(c.words[first])) return std::nullopt;
  const auto* interpreter = find_interpreter(c.words[first]);
  if (!interpreter)
    throw SnippetError(where + ": " + what + " `" + c.raw + "` runs `" + c.words[first] +
                       "`, which names no interpreter a fresh machine has: name " +
                       known_interpreters());
  Step s;
  s.interpreter = interpreter;
  s.source = c.raw;
  s.modules = command_imports(c);
  return s;
}

inline void check_modules(const Step& s, const std::string& where) {
  if (s.interpreter->peers) return;
  for (const auto& m : s.modules)
    if (std::find(kPeersOnlyModules.begin(), kPeersOnlyModules.end(), m) != kPeersOnlyModules.end())
      throw SnippetError(where + ": the step under " + std::string(s.interpreter->path) +
                         " imports " + m + ", which only the Python peers have: name " +
                         std::string(kPeersPrefix) + "/bin/python");
}

// The marker line's reason, nullopt for a line that is no marker; throws on a malformed one.
inline std::optional<std::string> marker(const std::string& line, const std::string& where) {
  const auto t = trim(line);
  if (!starts_with(t, "<!--") || t.find("readme-test") == std::string::npos) return std::nullopt;
  static const std::regex form(R"(<!-- readme-test: skip \(([^()]+)\) -->)");
  std::smatch m;
  if (!std::regex_match(t, m, form))
    throw SnippetError(where + ": `" + t +
                       "` is no readme-test marker; the one form is "
                       "`<!-- readme-test: skip (why) -->`, before the fenced block");
  return m[1].str();
}

// Inline code spans of prose (fenced blocks blanked out, lines kept): each span's text with
// line breaks as spaces, and the line it opens on. A run of backticks without its closing run
// is literal text, as CommonMark reads it.
inline std::vector<std::pair<int, std::string>> code_spans(const std::string& prose) {
  std::vector<std::pair<int, std::string>> spans;
  int line = 1;
  for (std::size_t i = 0; i < prose.size();) {
    if (prose[i] == '\n') {
      ++line, ++i;
      continue;
    }
    if (prose[i] != '`') {
      ++i;
      continue;
    }
    std::size_t n = 0;
    while (i + n < prose.size() && prose[i + n] == '`') ++n;
    const std::string run(n, '`');
    std::size_t close = prose.find(run, i + n);
    while (close != std::string::npos && close + n < prose.size() && prose[close + n] == '`')
      close = prose.find(run, prose.find_first_not_of('`', close));
    // A span ends within its paragraph: a blank line closes it first.
    if (close == std::string::npos || close > prose.find("\n\n", i)) {
      i += n;
      continue;
    }
    std::string text = prose.substr(i + n, close - i - n);
    const int lines_in = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
    std::replace(text.begin(), text.end(), '\n', ' ');
    spans.emplace_back(line, trim(text));
    line += lines_in;
    i = close + n;
  }
  return spans;
}

}  // namespace detail

inline std::vector<Step> extract_python_steps(const std::string& markdown,
                                              const std::string& name) {
  using namespace detail;
  std::vector<std::string> lines;
  {
    std::istringstream in(markdown);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  auto where = [&](int line) { return name + ":" + std::to_string(line); };

  std::vector<Step> steps;
  std::string prose;  // lines outside fences; fenced lines are left empty
  std::optional<std::pair<int, std::string>> pending;  // a marker's line and reason
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const int line_no = static_cast<int>(i) + 1;
    const auto& line = lines[i];
    const auto indent = line.find_first_not_of(' ');
    const bool fence = indent != std::string::npos && starts_with(line.substr(indent), "```");
    if (!fence) {
      prose += line + '\n';
      if (auto reason = marker(line, where(line_no))) {
        if (pending)
          throw SnippetError(where(pending->first) +
                             ": readme-test marker followed by another marker, not a fenced block");
        pending.emplace(line_no, *reason);
      } else if (pending && !trim(line).empty()) {
        throw SnippetError(where(pending->first) +
                           ": readme-test marker followed by text, not a fenced block");
      }
      continue;
    }
    // A fenced block: its opening run of backticks, info string and content, up to a line of
    // nothing but at least as many backticks.
    std::size_t ticks = 0;
    while (indent + ticks < line.size() && line[indent + ticks] == '`') ++ticks;
    const auto info = trim(line.substr(indent + ticks));
    const std::string lang = info.substr(0, info.find_first_of(" \t{"));
    std::vector<std::pair<int, std::string>> body;
    std::size_t j = i + 1;
    for (; j < lines.size(); ++j) {
      const auto t = trim(lines[j]);
      if (t.size() >= ticks && t.find_first_not_of('`') == std::string::npos) break;
      const auto& l = lines[j];
      const auto strip = std::min(indent, l.find_first_not_of(' ') == std::string::npos
                                              ? l.size()
                                              : l.find_first_not_of(' '));
      body.emplace_back(static_cast<int>(j) + 1, l.substr(strip));
    }
    if (j == lines.size())
      throw SnippetError(where(line_no) + ": the ```" + lang +
                         " fence opened here is never closed");
    for (std::size_t k = i; k <= j; ++k) prose += '\n';
    i = j;

    const std::size_t before = steps.size();
    if (lang == "python" || lang == "py") {
      Step s;
      s.line = line_no;
      s.block = true;
      std::string first;
      for (const auto& content : body)
        if (!trim(content.second).empty()) {
          first = trim(content.second);
          break;
        }
      static const std::regex run_with(R"(# Run with (\S+)( .*)?)");
      std::smatch m;
      if (!std::regex_match(first, m, run_with))
        throw SnippetError(where(line_no) +
                           ": a ```python block names its interpreter on its first line, "
                           "`# Run with INTERPRETER`: " +
                           known_interpreters());
      s.interpreter = find_interpreter(m[1].str());
      if (!s.interpreter || s.interpreter->tool != Tool::python)
        throw SnippetError(where(line_no) + ": `" + m[1].str() +
                           "` names no interpreter a fresh machine has: name " +
                           known_interpreters());
      for (const auto& content : body) s.source += content.second + '\n';
      add_imports(s.source, s.modules);
      check_modules(s, where(line_no));
      steps.push_back(std::move(s));
    } else if (lang == "sh" || lang == "bash" || lang == "shell" || lang == "console") {
      for (std::size_t k = 0; k < body.size(); ++k) {
        const int cmd_line = body[k].first;
        std::string joined = body[k].second;
        if (lang == "console" && starts_with(trim(joined), "$ ")) joined = trim(joined).substr(2);
        while (!joined.empty() && joined.back() == '\\' && k + 1 < body.size())
          joined = joined.substr(0, joined.size() - 1) + ' ' + trim(body[++k].second);
        for (const auto& c : shell_commands(joined))
          if (auto s = command_step(c, where(cmd_line), "the command")) {
            s->line = cmd_line;
            check_modules(*s, where(cmd_line));
            steps.push_back(std::move(*s));
          }
      }
    }
    if (pending) {
      if (steps.size() == before)
        throw SnippetError(where(pending->first) +
                           ": readme-test marker over a fenced block with no Python step");
      for (auto k = before; k < steps.size(); ++k) steps[k].skip_reason = pending->second;
      pending.reset();
    }
  }
  if (pending)
    throw SnippetError(where(pending->first) +
                       ": readme-test marker at the end of the file, over no fenced block");

  for (const auto& [line_no, text] : code_spans(prose))
    for (const auto& c : shell_commands(text))
      if (c.words.size() > 1)
        if (auto s = command_step(c, where(line_no), "the inline code"))
          check_modules(*s, where(line_no));
  return steps;
}

}  // namespace mixtrain::test::readme
