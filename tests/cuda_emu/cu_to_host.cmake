# cmake -DIN=<kernel.cu> -DOUT=<file.cc> -P cu_to_host.cmake: the kernel source as host C++ for the
# emulator. Every launch `name<targs><<<config>>>(args)` becomes
# `RT_EMU_LAUNCH(config)([=](auto... a) { name<targs>(a...); })(args)`: the lambda defers the
# call (and the deduction of any remaining template arguments) to each emulated thread; it runs
# later, from the launch's stream, so it captures by value. Line breaks stay, so that #line keeps
# compiler messages on the source's lines.
file(READ ${IN} src)
string(REGEX REPLACE
       "([A-Za-z_][A-Za-z0-9_:]*(<[^<>;{}]*>)?)([ \t\r\n]*)<<<([^<>]*)>>>"
       "RT_EMU_LAUNCH(\\4)([=](auto... rt_emu_a) { \\1(rt_emu_a...); })\\3" out "${src}")
string(FIND "${out}" "<<<" left)
if(NOT left EQUAL -1)
  message(FATAL_ERROR "cu_to_host: a launch in ${IN} was not rewritten (at character ${left})")
endif()
file(WRITE ${OUT}.tmp "#include \"tests/cuda_emu/emu.h\"\n#line 1 \"${IN}\"\n${out}")
# Rewritten only when changed, so that an unchanged kernel source is not recompiled.
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
