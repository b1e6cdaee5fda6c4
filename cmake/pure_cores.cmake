# The pure cores do no I/O (docs/design.md, "Layers"): a core target may not
# link, directly or through what it links, a target that owns sockets,
# threads for I/O, files or devices. Checked at configure time once every
# target exists; a crossing stops the configure naming the path.
#
# tessera_check_pure_cores(CORES a b ... FORBIDDEN x y ...): every target in
# CORES that exists must not reach a target in FORBIDDEN (targets, or
# imported library names such as libzmq) through LINK_LIBRARIES or
# INTERFACE_LINK_LIBRARIES.

# Appends to `out` the dependencies of `target` (its direct links), with
# $<LINK_ONLY:x> unwrapped and other generator expressions skipped.
function(_tessera_direct_links target out)
  set(links "")
  foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
    get_target_property(v ${target} ${prop})
    if(v)
      foreach(item IN LISTS v)
        if(item MATCHES "^\\$<LINK_ONLY:([^>]+)>$")
          list(APPEND links ${CMAKE_MATCH_1})
        elseif(NOT item MATCHES "^\\$<")
          list(APPEND links ${item})
        endif()
      endforeach()
    endif()
  endforeach()
  set(${out} ${links} PARENT_SCOPE)
endfunction()

function(tessera_check_pure_cores)
  cmake_parse_arguments(P "" "" "CORES;FORBIDDEN" ${ARGN})
  set(problems "")
  foreach(core IN LISTS P_CORES)
    if(NOT TARGET ${core})
      continue()
    endif()
    # Breadth-first over links; `via_<t>` remembers how t was reached.
    set(queue ${core})
    set(seen ${core})
    set(via_${core} ${core})
    while(queue)
      list(POP_FRONT queue t)
      if(NOT TARGET ${t})
        continue()
      endif()
      get_target_property(aliased ${t} ALIASED_TARGET)
      _tessera_direct_links(${t} links)
      foreach(d IN LISTS links)
        if(d IN_LIST seen)
          continue()
        endif()
        list(APPEND seen ${d})
        set(via_${d} "${via_${t}} -> ${d}")
        if(d IN_LIST P_FORBIDDEN)
          list(APPEND problems "${via_${d}}")
        else()
          list(APPEND queue ${d})
        endif()
      endforeach()
    endwhile()
  endforeach()
  if(problems)
    list(JOIN problems "\n  " text)
    message(FATAL_ERROR "a pure core links a target that does I/O (docs/design.md, \"Layers\"):\n  ${text}\n"
                        "Move the I/O into the shell, or give the core an interface the shell implements.")
  endif()
endfunction()
