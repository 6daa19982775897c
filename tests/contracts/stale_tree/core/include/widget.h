// A header whose comments cite code, for cited_names_exist.py's own test (see CMakeLists.txt):
// Widget::here() and `Widget` exist; Widget::gone, vanished() and `also_gone` do not;
// `mixtrain sample` and `data.block_size` are not code.
#pragma once

class Widget {
 public:
  void here();
};
