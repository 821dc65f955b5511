# cli.bench_scripts: scripts/bench-torch and scripts/bench-train write relative output paths into
# the caller's working directory (not the checkout) and say where they wrote (issue #11, item 18).
# Tiny sizes; timings are never asserted. Run with -DSOURCE_DIR=<the checkout> -DWORK_DIR=<a
# scratch dir>.
set(dir ${WORK_DIR}/cli_bench_scripts)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
file(REMOVE ${SOURCE_DIR}/fopt_scripts_torch.json ${SOURCE_DIR}/fopt_scripts_train.json
            ${SOURCE_DIR}/fopt_scripts_dist.json)

function(run_script script json)
  execute_process(COMMAND ${SOURCE_DIR}/scripts/${script} ${ARGN} --json ${json}
                  WORKING_DIRECTORY ${dir}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  # A gloo rank that aborts as it exits, after destroy_process_group() (tests/python/test_docs.py says more):
  # run again, once.
  if(NOT rc EQUAL 0 AND err MATCHES "terminate called without an active exception")
    execute_process(COMMAND ${SOURCE_DIR}/scripts/${script} ${ARGN} --json ${json}
                    WORKING_DIRECTORY ${dir}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "scripts/${script} exited with ${rc}:\n${out}\n${err}")
  endif()
  if(NOT EXISTS ${dir}/${json} OR EXISTS ${SOURCE_DIR}/${json})
    message(FATAL_ERROR "scripts/${script} --json ${json} from ${dir} did not write ${dir}/${json}")
  endif()
  if(NOT err MATCHES "wrote ${dir}/${json}")
    message(FATAL_ERROR "scripts/${script} does not say where it wrote:\n${err}")
  endif()
endfunction()

run_script(bench-torch fopt_scripts_torch.json --optimizer sgd --numel 1000 --rounds 1 --warmup 0)
run_script(bench-train fopt_scripts_train.json --model mobilenet_v1 --image-size 8 --num-classes 10
           --batch-size 2 --steps 1 --warmup 0 --impls fused)
# The data-parallel comparison: 2 ranks under torchrun, every impl once (the FSDP2 rows by name).
run_script(bench-train fopt_scripts_dist.json --nproc 2 --model transformer_small --n-layer 1 --d-model 32
           --seq-len 8 --vocab 64 --batch-size 4 --steps 1 --warmup 0 --timeout 120
           --impls ddp_torch,ddp_torch_fused,ddp_fused,zero0,zero1,fsdp2_torch,fsdp2_torch_fused,fsdp2_fused)
# Its rounds: each kept once, the disturbed ones (other processes over 5 % of the machine) repeated.
file(READ ${dir}/fopt_scripts_dist.json json)
string(JSON kept GET "${json}" load kept)
string(JSON discarded GET "${json}" load discarded)
if(NOT kept EQUAL 1 OR discarded GREATER 1)
  message(FATAL_ERROR "bench-train --nproc 2: ${kept} rounds kept, ${discarded} thrown away (1 and at most 1)")
endif()
