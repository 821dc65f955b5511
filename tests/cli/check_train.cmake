# cli.train: `fusedopt train --compare` on a tiny MobileNetV1 writes the JSON report (the keys the
# issue names, checked with string(JSON)), the Markdown table, the PNG chart (when the .venv with
# matplotlib is there) and a trace that `fusedopt doctor --trace` reads; one run on the digits
# data (when scripts/build has exported it); bad options fail naming the option and the value.
# Run with -DFUSEDOPT=<the CLI> -DWORK_DIR=<a scratch dir> -DFOPT_CMAKE_DIR=<cmake/>
# -DSOURCE_DIR=<the checkout> -DDIGITS_CSV=<build/data/digits.csv>.
include(${FOPT_CMAKE_DIR}/FoptCheckJson.cmake)
set(out ${WORK_DIR}/cli_train)
file(REMOVE_RECURSE ${out})
set(tiny --model mobilenet_v1 --image-size 8 --num-classes 10 --batch-size 2 --steps 3 --warmup 1 --quiet)
execute_process(COMMAND ${FUSEDOPT} train --compare ${tiny} --out ${out} --trace ${out}/trace.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fusedopt train --compare exited with ${rc}:\n${stdout}\n${stderr}")
endif()
foreach(text "throughput \\(samples/s\\)" "optimizer share of the step" "Amdahl bound" "trace:")
  if(NOT stdout MATCHES "${text}")
    message(FATAL_ERROR "the table lacks '${text}':\n${stdout}")
  endif()
endforeach()
file(READ ${out}/mobilenet_v1_adamw.json json)
foreach(key model speedup amdahl_bound bound_gain_captured max_loss_rel_diff_first10)
  expect_key("${json}" "*" ${key})
endforeach()
foreach(impl torch fused)
  foreach(key samples_per_s optimizer_ms step_ms optimizer_share total_s)
    expect_key("${json}" "*" impls ${impl} ${key})
  endforeach()
endforeach()
expect_key("${json}" "*" doctor predicted_speedup)
file(READ ${out}/mobilenet_v1_adamw.md markdown)
if(NOT markdown MATCHES "\\| speedup \\(step time\\) \\|")
  message(FATAL_ERROR "the Markdown table lacks the speedup row:\n${markdown}")
endif()
if(EXISTS ${SOURCE_DIR}/.venv/bin/python)
  file(READ ${out}/mobilenet_v1_adamw.png magic LIMIT 8 HEX)
  if(NOT magic STREQUAL "89504e470d0a1a0a")
    message(FATAL_ERROR "the chart is not a PNG (${magic})")
  endif()
endif()

execute_process(COMMAND ${FUSEDOPT} doctor --trace ${out}/trace.json --rounds 3 --json ${out}/doctor.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT rc EQUAL 0 OR NOT stdout MATCHES "verdict")
  message(FATAL_ERROR "fusedopt doctor --trace exited with ${rc}:\n${stdout}\n${stderr}")
endif()

if(EXISTS ${DIGITS_CSV})
  execute_process(COMMAND ${FUSEDOPT} train --dataset digits --impl fused --model mobilenet_v1 --image-size 8
                          --batch-size 16 --steps 3 --warmup 0 --quiet --json ${out}/digits.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fusedopt train --dataset digits exited with ${rc}:\n${stdout}\n${stderr}")
  endif()
else()
  message(STATUS "${DIGITS_CSV} not there (scripts/build exports it): digits run skipped")
endif()

foreach(bad "--impl;jax" "--optimizer;lbfgs" "--lr;-1" "--dtype;f64" "--dataset;imagenet" "--accumulation-steps;0")
  execute_process(COMMAND ${FUSEDOPT} train ${tiny} ${bad} RESULT_VARIABLE rc OUTPUT_VARIABLE stdout
                  ERROR_VARIABLE stderr)
  list(GET bad 1 value)
  if(rc EQUAL 0 OR NOT stderr MATCHES "${value}")
    message(FATAL_ERROR "fusedopt train ${bad}: expected a failure naming ${value}, got ${rc}:\n${stderr}")
  endif()
endforeach()
