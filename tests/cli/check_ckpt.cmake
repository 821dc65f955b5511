# cli.ckpt: `fusedopt ckpt inspect|verify` on a checkpoint that fusedopt.save_checkpoint wrote
# (data/tiny_adamw.safetensors: FusedAdamW over Linear(3, 2), one step), a file that is not a
# checkpoint and a missing one. Run with -DFUSEDOPT=<binary> -DCKPT=<the checkpoint> -DOTHER=<a text file>.
function(run expected_rc)
  execute_process(COMMAND ${FUSEDOPT} ckpt ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL expected_rc)
    message(FATAL_ERROR "fusedopt ckpt ${ARGN}: exit ${rc}, not ${expected_rc}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect text haystack)
  string(FIND "${haystack}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected '${text}' in:\n${haystack}")
  endif()
endfunction()

run(0 inspect ${CKPT})
foreach(text "checksum ok" "optimizer_class: \"FusedAdamW\"" "algorithm: \"adamw\"" "model: yes"
             "state.0.exp_avg_sq" "F32" "(2, 3)" "model.bias")
  expect("${text}" "${out}")
endforeach()
run(0 verify ${CKPT})
expect("ok ${CKPT}: 8 tensors" "${out}")
# Every file is checked and each failure named; the status is 1 if any failed.
run(1 verify ${CKPT} ${OTHER} ${WORK_DIR}/no-such.safetensors)
expect("ok ${CKPT}" "${out}")
expect("${OTHER}" "${err}")
expect("no-such.safetensors: No such file or directory" "${err}")
run(2 check ${CKPT})  # an unknown action is a usage error
