// Widget::gone is cited here too, but only headers are checked.
#include "widget.h"

void Widget::here() {}
