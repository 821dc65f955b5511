# cli.doctor: `fusedopt doctor --trace` on a tiny hand-written timeline (torch and fused,
# tests/cli/data/doctor_tiny_trace.json), then --numels with given times (lamb too), its JSON keys
# checked; the distributed plan (--ranks); bad values exit non-zero naming the option. Run with
# -DFUSEDOPT=<the CLI> -DWORK_DIR=<a scratch dir> -DFOPT_CMAKE_DIR=<cmake/> -DTRACE=<the trace>.
include(${FOPT_CMAKE_DIR}/FoptCheckJson.cmake)
function(run_doctor name)
  set(out_json ${WORK_DIR}/cli_doctor_${name}.json)
  file(REMOVE ${out_json})
  execute_process(COMMAND ${FUSEDOPT} doctor ${ARGN} --rounds 2 --json ${out_json}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "verdict: ")
    message(FATAL_ERROR "fusedopt doctor ${ARGN} exited with ${rc}:\n${out}\n${err}")
  endif()
  file(READ ${out_json} json)
  set(json "${json}" PARENT_SCOPE)
  set(out "${out}" PARENT_SCOPE)
endfunction()


run_doctor(trace --trace ${TRACE})
expect_key("${json}" torch impl)
expect_key("${json}" trace optimizer_ms_source)
expect_key("${json}" 2 num_tensors)
expect_key("${json}" 800 numel)
expect_key("${json}" 16 standard ops)      # AdamW, wd 0.01: 8 ops per tensor
expect_key("${json}" 22400 fused bytes)    # 7 passes x 800 x 4 bytes
foreach(key step_ms optimizer_ms optimizer_share amdahl_bound predicted_step_ms predicted_speedup
            predicted_bound_gain_captured verdict)
  expect_key("${json}" "*" ${key})
endforeach()
foreach(key fused_ms same_traffic_ms ceiling_gb_per_s standard_gb_per_s)
  expect_key("${json}" "*" measured ${key})
endforeach()
expect_key("${json}" "*" trace_fused measured_speedup)

run_doctor(numels --numels 300,500 --optimizer sgd --momentum 0.9 --weight-decay 1e-4 --clip 1
           --step-ms 10 --optimizer-ms 1)
expect_key("${json}" given optimizer_ms_source)
expect_key("${json}" 15 standard ops)      # 4 ops x 2 tensors + clip 2 x 2 + 3

# LAMB, two-phase: 15 ops per tensor (its global gradient norm and its two norms included); fused
# the reduction pass and the update, 11 passes.
run_doctor(lamb --numels 300,500 --optimizer lamb --step-ms 10 --optimizer-ms 1)
expect_key("${json}" 30 standard ops)
expect_key("${json}" 35200 fused bytes)    # 11 passes x 800 x 4 bytes

# Adafactor (the doctor's tensors are vectors): 9 ops per tensor (the param's norm, grad * grad,
# lerp_, clone, clamp_, rsqrt_, mul_, the update's norm, add_), 19 passes; fused the stats pass
# (param, grad, variance read) and the update (param, variance r+w, grad read), 8 passes.
run_doctor(adafactor --numels 300,500 --optimizer adafactor --step-ms 10 --optimizer-ms 1)
expect_key("${json}" 18 standard ops)
expect_key("${json}" 60800 standard bytes)  # 19 passes x 800 x 4 bytes
expect_key("${json}" 2 fused ops)
expect_key("${json}" 25600 fused bytes)     # 8 passes x 800 x 4 bytes

# The distributed plan, ZeRO-1 only: 800 f32 elements on 8 ranks make one bucket of 8 shards of
# 256 elements (the smallest alignment), all of which travel: RS + AG 7 x 256 x (4 + 4) B per rank;
# one rank sends nothing.
run_doctor(plan --numels 300,500 --step-ms 10 --optimizer-ms 1 --ranks 1,8 --zero 1 --link-gbps 10)
if(NOT out MATCHES "distributed plan")
  message(FATAL_ERROR "fusedopt doctor --ranks printed no plan:\n${out}")
endif()
expect_key("${json}" 1 distributed 0 ranks)
expect_key("${json}" 0 distributed 0 bytes_sent_per_rank)
expect_key("${json}" 8 distributed 1 ranks)
expect_key("${json}" 1 distributed 1 zero)
expect_key("${json}" 14336 distributed 1 bytes_sent_per_rank)
expect_key("${json}" 2048 distributed 1 state_bytes_per_rank)  # 256 x 2 states x 4 B
foreach(key memory_bytes_per_rank optimizer_ms comm_ms sequential_ms pipelined_ms predicted_step_ms
            speedup scaling_efficiency)
  expect_key("${json}" "*" distributed 1 ${key})
endforeach()
expect_no_key("${json}" distributed 2)
expect_key("${json}" 10 distributed_model link_gbps)
# The plan's flags need --ranks.
expect_exit(2 "--zero.*--ranks" ${FUSEDOPT} doctor --numels 300 --step-ms 10 --zero 1 --rounds 1)

# Each entry: the bad option and value first, then what else it needs.
foreach(bad "--optimizer;adafactors;--step-ms;10" "--step-ms;-1" "--optimizer-ms;20;--step-ms;10"
            "--clip;abc;--step-ms;10" "--dtype;f64;--step-ms;10" "--ranks;0;--step-ms;10"
            "--ranks;1025;--step-ms;10" "--zero;2;--ranks;2;--step-ms;10"
            "--link-gbps;-5;--ranks;2;--step-ms;10" "--bucket-mb;0;--ranks;2;--step-ms;10")
  execute_process(COMMAND ${FUSEDOPT} doctor --numels 300,500 --rounds 1 ${bad}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  list(GET bad 0 option)
  list(GET bad 1 value)
  if(rc EQUAL 0 OR NOT err MATCHES "${option}" OR NOT err MATCHES "${value}")
    message(FATAL_ERROR "fusedopt doctor ${bad}: expected a failure naming ${option} and ${value}, "
                        "got ${rc}:\n${err}")
  endif()
endforeach()
