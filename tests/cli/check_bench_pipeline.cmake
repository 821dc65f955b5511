# cli.bench_pipeline: `fusedopt bench --json` on tiny sizes (2 rounds), its JSON keys checked with
# string(JSON) in a cmake -P script (no Python): the default impls and keys, the training-loop
# step (--grad-dtype, --loss-scale, --clip) with standard_pipeline and no skipped step, 8-bit states
# (--state-dtype q8), and bad option values (a non-zero exit naming the option and the value).
# Timings are never asserted.
# Run with -DFUSEDOPT=<the CLI> -DWORK_DIR=<a scratch dir> -DFOPT_CMAKE_DIR=<cmake/>.
include(${FOPT_CMAKE_DIR}/FoptCheckJson.cmake)
set(tiny --numel 70000 --rounds 2 --warmup 1)

function(run_bench name)
  set(out_json ${WORK_DIR}/cli_bench_${name}.json)
  file(REMOVE ${out_json})
  execute_process(COMMAND ${FUSEDOPT} bench ${ARGN} --json ${out_json}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fusedopt bench ${ARGN} exited with ${rc}:\n${out}\n${err}")
  endif()
  file(READ ${out_json} json)
  set(json "${json}" PARENT_SCOPE)
endfunction()

function(expect_impl json impl)
  foreach(field median_ms min_ms samples_ms gparam_per_s gb_per_s)
    expect_key("${json}" "*" impls ${impl} ${field})
  endforeach()
endfunction()

# Adafactor, factored: a vector moves 32 B/param in f32 (stats: param, grad, variance read;
# update: param and variance r+w, grad read); with --shapes, the model's matrices 24 (stats,
# norm and update passes: param r, grad r; grad r; param r+w, grad r), 1×1 matrices 44 (their
# factors element-wise, read in the stats pass, read and written in the update): bytes_per_param
# is the mean over the params.
run_bench(adafactor --optimizer adafactor ${tiny})
expect_key("${json}" 32 bytes_per_param)
expect_key("${json}" ON reduction_pass)
foreach(impl fused standard same_traffic)
  expect_impl("${json}" ${impl})
endforeach()
run_bench(adafactor_shapes --optimizer adafactor --shapes mobilenet_v1 --rounds 2 --warmup 1)
string(JSON bytes GET "${json}" bytes_per_param)
if(NOT bytes GREATER 24 OR NOT bytes LESS 44)
  message(FATAL_ERROR "adafactor on mobilenet_v1: bytes_per_param ${bytes}, expected in (24, 44)")
endif()

# Without --loss-scale/--clip: the impls and keys as before.
run_bench(default --optimizer adamw ${tiny})
foreach(impl fused standard same_traffic)
  expect_impl("${json}" ${impl})
endforeach()
foreach(key speedup_vs_standard bandwidth_fraction numel threads target)
  expect_key("${json}" "*" ${key})
endforeach()
expect_key("${json}" 28 bytes_per_param)
foreach(key speedup_vs_standard_pipeline loss_scale clip grad_dtype state_bytes_per_param)
  expect_no_key("${json}" ${key})
endforeach()
expect_no_key("${json}" impls standard_pipeline)

# 8-bit states: no standard impl (left_out says why), same_traffic moving the 8-bit step's bytes:
# AdamW with f32 params and grads, 70000 params in 274 blocks: 12 + 2 states × 2 B per param, and
# 2 states × (4 B read + 4 B written) per block: 16.0626 B/param. With --loss-scale, no
# standard_pipeline either, and the pre-pass reads the grads once more (+4 B).
run_bench(q8 --optimizer adamw --state-dtype q8 ${tiny})
foreach(impl fused same_traffic)
  expect_impl("${json}" ${impl})
endforeach()
expect_no_key("${json}" impls standard)
expect_no_key("${json}" speedup_vs_standard)
expect_key("${json}" q8 state_dtype)
expect_key("${json}" "*" left_out standard)
string(JSON bytes GET "${json}" bytes_per_param)
if(NOT bytes GREATER 16.062 OR NOT bytes LESS 16.063)
  message(FATAL_ERROR "adamw with q8 states: bytes_per_param ${bytes}, expected 16.0626")
endif()
run_bench(q8_loop --optimizer adamw --state-dtype q8 --loss-scale dynamic ${tiny})
expect_no_key("${json}" impls standard_pipeline)
expect_key("${json}" "*" left_out standard_pipeline)
expect_key("${json}" 0 impls fused skipped_steps)
string(JSON bytes GET "${json}" bytes_per_param)
if(NOT bytes GREATER 20.062 OR NOT bytes LESS 20.063)
  message(FATAL_ERROR "adamw with q8 states, loss scaling: bytes_per_param ${bytes}, expected 20.0626")
endif()
# LAMB with q8 states: AdamW's 16.0626 B/param, and its reduction pass reads the param, the grad,
# each code and each block's absmax once more (4 + 4 + 2 + 2 × 4 × 274 / 70000): 26.0939.
run_bench(q8_lamb --optimizer lamb --state-dtype q8 ${tiny})
expect_impl("${json}" same_traffic)
string(JSON bytes GET "${json}" bytes_per_param)
if(NOT bytes GREATER 26.093 OR NOT bytes LESS 26.095)
  message(FATAL_ERROR "lamb with q8 states: bytes_per_param ${bytes}, expected 26.0939")
endif()

# The acceptance configuration, tiny: bf16 grads of f32 params, dynamic loss scale, clip 1.0.
run_bench(pipeline --optimizer adamw --grad-dtype bf16 --loss-scale dynamic --clip 1.0 ${tiny})
foreach(impl fused standard standard_pipeline same_traffic)
  expect_impl("${json}" ${impl})
endforeach()
foreach(key speedup_vs_standard_pipeline speedup_vs_standard bandwidth_fraction grad_norm
            clip_coef loss_scale_init)
  expect_key("${json}" "*" ${key})
endforeach()
expect_key("${json}" bf16 grad_dtype)
expect_key("${json}" dynamic loss_scale)
expect_key("${json}" 1 clip)
expect_key("${json}" 8 state_bytes_per_param)
expect_key("${json}" 28 bytes_per_param)  # f32 param r+w 8, bf16 grad 2 + 2 (pre-pass), 2 states 16
expect_key("${json}" 0 impls fused skipped_steps)
expect_key("${json}" 0 impls standard_pipeline skipped_steps)
expect_key("${json}" 65536 impls fused final_loss_scale)
foreach(pass convert unscale inf_check norm clip step)
  expect_key("${json}" "*" impls standard_pipeline passes_median_ms ${pass})
endforeach()
string(JSON coef GET "${json}" clip_coef)
if(NOT coef LESS 1)
  message(FATAL_ERROR "the clip should be active (clip_coef < 1), clip_coef = ${coef}")
endif()

# f16 grads of bf16 params, static scale, no clip; SGD.
run_bench(static --optimizer sgd --dtype bf16 --grad-dtype f16 --loss-scale static ${tiny})
expect_key("${json}" f16 grad_dtype)
expect_key("${json}" static loss_scale)
expect_null("${json}" clip)
expect_key("${json}" 0 impls standard_pipeline skipped_steps)
expect_no_key("${json}" impls standard_pipeline passes_median_ms norm)

# Bad values: a non-zero exit and a message naming the option and the value.
foreach(bad "--loss-scale;bogus" "--grad-dtype;f64" "--clip;abc" "--clip=-1" "--clip;0"
            "--state-dtype;bogus" "--state-dtype;q8;--optimizer;adamp")
  execute_process(COMMAND ${FUSEDOPT} bench ${tiny} ${bad}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  list(GET bad 0 option)
  string(REGEX REPLACE "=.*" "" option "${option}")
  if(rc EQUAL 0 OR NOT err MATCHES "${option}")
    message(FATAL_ERROR "fusedopt bench ${bad}: expected a failure naming ${option}, got ${rc}:\n${err}")
  endif()
endforeach()
