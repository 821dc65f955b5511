# cli.dist (label mpi): `fusedopt bench-dist` and `fusedopt train --dist` under mpirun on 2 ranks,
# small sizes: the JSON the issue names, ZeRO-1's bytes and state against data parallel, the
# distributed run's losses against one process on the whole batches (--reference), the per-rank
# trace with the collectives' spans, and bad input. Every mpirun is bounded by execute_process's
# TIMEOUT. Run with -DFUSEDOPT=<the CLI> -DWORK_DIR=<a scratch dir> -DFOPT_CMAKE_DIR=<cmake/>
# -DMPIEXEC=<mpiexec> -DMPIEXEC_FLAGS=<its flags, ;-separated>.
include(${FOPT_CMAKE_DIR}/FoptCheckJson.cmake)
set(dir ${WORK_DIR}/cli_dist)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
set(mpirun ${MPIEXEC} -n 2 ${MPIEXEC_FLAGS})

function(run_ok)
  execute_process(COMMAND ${mpirun} ${FUSEDOPT} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 120)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mpirun fusedopt ${ARGN}: exit '${rc}'\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

# bench-dist: the three impls; ZeRO-1 sends no more than all-reduce-then-step and holds about half
# the state (a 1/2 share of 40 chunks, padded to whole chunks).
run_ok(bench-dist --optimizer adamw --numel 1300000 --bucket-mb 1 --rounds 2 --warmup 1
       --json ${dir}/bench.json)
if(NOT out MATCHES "\\| zero1 \\|")
  message(FATAL_ERROR "bench-dist printed no table:\n${out}")
endif()
file(READ ${dir}/bench.json json)
expect_key("${json}" 2 ranks)
expect_key("${json}" adamw optimizer)
expect_key("${json}" 1300000 numel)
expect_key("${json}" 1 threads_per_rank)
foreach(impl allreduce_then_step pipelined zero1)
  foreach(key median_ms bytes_sent_per_rank state_bytes_per_rank exposed_comm_ms)
    expect_key("${json}" * impls ${impl} ${key})
  endforeach()
endforeach()
string(JSON sent_ar GET "${json}" impls allreduce_then_step bytes_sent_per_rank)
string(JSON sent_z1 GET "${json}" impls zero1 bytes_sent_per_rank)
string(JSON state_ar GET "${json}" impls allreduce_then_step state_bytes_per_rank)
string(JSON state_z1 GET "${json}" impls zero1 state_bytes_per_rank)
math(EXPR state_bound "${state_ar} * 55 / 100")
if(sent_z1 GREATER sent_ar OR state_z1 GREATER state_bound)
  message(FATAL_ERROR "zero1 sends ${sent_z1} (all-reduce: ${sent_ar}) and holds ${state_z1} "
                      "(all-reduce: ${state_ar})")
endif()

# Threads per rank (the choice printed above the table): OMP_NUM_THREADS's count when set (this test
# runs with 1); unset, the CPUs of the host (nproc: those this process may use, as OpenMP counts them)
# shared by its 2 ranks, at least 1 each.
if(NOT out MATCHES "threads per rank: 1 \\(OMP_NUM_THREADS=1\\)")
  message(FATAL_ERROR "bench-dist with OMP_NUM_THREADS=1 printed no such choice:\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=OMP_NUM_THREADS nproc  # (nproc reads it too)
                OUTPUT_VARIABLE cpus OUTPUT_STRIP_TRAILING_WHITESPACE)
math(EXPR share "${cpus} / 2")
if(share LESS 1)
  set(share 1)
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=OMP_NUM_THREADS ${mpirun} ${FUSEDOPT}
                        bench-dist --optimizer sgd --numel 100000 --rounds 1 --warmup 0
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0 OR NOT out MATCHES
   "threads per rank: ${share} \\(${cpus} CPU\\(s\\) shared by 2 rank\\(s\\) on this host\\)")
  message(FATAL_ERROR "bench-dist without OMP_NUM_THREADS (${cpus} CPUs): exit '${rc}'\n${out}${err}")
endif()

# 8-bit states: about a quarter of the f32 state bytes (a byte and 1/64 of an absmax per element for
# each moment), and ZeRO-1 halves them again. LAMB takes them (its per-tensor sums completed across
# the ranks); AdamP, whose sums are per row of a tensor, refuses them.
run_ok(bench-dist --optimizer adamw --numel 1300000 --bucket-mb 1 --rounds 1 --warmup 0
       --state-dtype q8 --json ${dir}/q8.json)
file(READ ${dir}/q8.json json)
expect_key("${json}" q8 state_dtype)
string(JSON q8_ar GET "${json}" impls allreduce_then_step state_bytes_per_rank)
string(JSON q8_z1 GET "${json}" impls zero1 state_bytes_per_rank)
math(EXPR q8_bound "${state_ar} * 26 / 100")
math(EXPR q8_z1_bound "${q8_ar} * 55 / 100")
if(q8_ar GREATER q8_bound OR q8_z1 GREATER q8_z1_bound)
  message(FATAL_ERROR "8-bit states: ${q8_ar} bytes per rank (f32: ${state_ar}), zero1 ${q8_z1}")
endif()
run_ok(bench-dist --optimizer lamb --numel 1300000 --bucket-mb 1 --rounds 1 --warmup 0
       --state-dtype q8 --json ${dir}/q8_lamb.json)
file(READ ${dir}/q8_lamb.json json)
string(JSON q8_lamb_ar GET "${json}" impls allreduce_then_step state_bytes_per_rank)
string(JSON q8_lamb_z1 GET "${json}" impls zero1 state_bytes_per_rank)
math(EXPR q8_lamb_z1_bound "${q8_lamb_ar} * 55 / 100")
if(q8_lamb_z1 GREATER q8_lamb_z1_bound)
  message(FATAL_ERROR "LAMB, 8-bit states: zero1 ${q8_lamb_z1} bytes per rank, zero 0 ${q8_lamb_ar}")
endif()
execute_process(COMMAND ${mpirun} ${FUSEDOPT} bench-dist --optimizer adamp --numel 100000 --rounds 1
                        --warmup 0 --state-dtype q8
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "8-bit states \\(state_dtype q8\\) are not for adamp")
  message(FATAL_ERROR "bench-dist --optimizer adamp --state-dtype q8: exit '${rc}'\n${out}${err}")
endif()

# AdamP's sums are per channel row, which shards cut: no zero1 row. LAMB's per-tensor norms are
# completed across ranks: it has one.
run_ok(bench-dist --optimizer adamp --numel 100000 --rounds 1 --warmup 0 --json ${dir}/adamp.json)
file(READ ${dir}/adamp.json json)
expect_key("${json}" * impls pipelined median_ms)
expect_no_key("${json}" impls zero1)
run_ok(bench-dist --optimizer lamb --numel 100000 --rounds 1 --warmup 0 --json ${dir}/lamb.json)
file(READ ${dir}/lamb.json json)
expect_key("${json}" * impls zero1 median_ms)

# train --dist with ZeRO-1 and 8-bit states: rank 0's table and report, the losses within 1e-4 of
# one process (fusedopt::pt, 8-bit states too) on the whole batches, the trace with every rank and
# the reduce-scatter / all-gather spans.
run_ok(train --dist --zero 1 --model transformer_small --batch-size 4 --steps 3 --warmup 0
       --state-dtype q8 --reference --quiet --json ${dir}/train.json --trace ${dir}/trace.json)
if(NOT out MATCHES "fusedopt train --dist" OR NOT out MATCHES "\\| threads per rank \\| 1 \\(OMP_NUM")
  message(FATAL_ERROR "train --dist printed no table (or no thread choice):\n${out}")
endif()
file(READ ${dir}/train.json json)
expect_key("${json}" 2 ranks)
expect_key("${json}" 1 zero)
expect_key("${json}" 2 batch_per_rank)
expect_key("${json}" 1 threads_per_rank)
expect_key("${json}" q8 state_dtype)
string(JSON diff GET "${json}" max_loss_rel_diff_vs_one_process)
if(NOT diff LESS 1e-4)
  message(FATAL_ERROR "train --dist losses differ from one process by ${diff}")
endif()
file(READ ${dir}/trace.json trace)
foreach(name "rank 1" reduce_scatter all_gather backward)
  if(NOT trace MATCHES "\"${name}\"")
    message(FATAL_ERROR "the trace has no '${name}'")
  endif()
endforeach()

# Checkpoints of train --dist: a shard set every 2 updates (each rank writes its file). A run that
# resumes from update 2, skipping a newer set with a rank missing, ends where the uninterrupted run
# ends: the two final sets, consolidated, are the same bytes; and the same losses.
set(common train --dist --zero 1 --model transformer_small --batch-size 4 --steps 4 --warmup 0
    --quiet --checkpoint-every 2)
run_ok(${common} --checkpoint-dir ${dir}/whole --json ${dir}/whole.json)
file(GLOB sets RELATIVE ${dir}/whole ${dir}/whole/*)
list(SORT sets)
if(NOT sets STREQUAL "step-00000002.rank0-of-2.safetensors;step-00000002.rank1-of-2.safetensors;step-00000004.rank0-of-2.safetensors;step-00000004.rank1-of-2.safetensors")
  message(FATAL_ERROR "train --dist --checkpoint-dir wrote ${sets}")
endif()
file(MAKE_DIRECTORY ${dir}/resumed)
foreach(rank 0 1)
  file(COPY_FILE ${dir}/whole/step-00000002.rank${rank}-of-2.safetensors
       ${dir}/resumed/step-00000002.rank${rank}-of-2.safetensors)
endforeach()
file(COPY_FILE ${dir}/whole/step-00000004.rank0-of-2.safetensors
     ${dir}/resumed/step-00000003.rank0-of-2.safetensors)
execute_process(COMMAND ${mpirun} ${FUSEDOPT} ${common} --checkpoint-dir ${dir}/resumed --resume
                        --json ${dir}/resumed.json
                RESULT_VARIABLE rc ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0 OR NOT err MATCHES "skipping checkpoint [^\n]*step-00000003[^\n]*rank 1 of 2 is missing"
   OR NOT err MATCHES "resuming from [^\n]*step-00000002.safetensors \\(update 2\\)")
  message(FATAL_ERROR "train --dist --resume: exit '${rc}'\n${err}")
endif()
foreach(run whole resumed)
  execute_process(COMMAND ${FUSEDOPT} ckpt consolidate ${dir}/${run}/step-00000004.safetensors
                          -o ${dir}/${run}.safetensors
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "2 shards")
    message(FATAL_ERROR "ckpt consolidate ${run}: exit '${rc}'\n${out}${err}")
  endif()
  file(SHA256 ${dir}/${run}.safetensors sha_${run})
  file(READ ${dir}/${run}.json json)
  string(JSON losses_${run} GET "${json}" losses)
endforeach()
if(NOT sha_whole STREQUAL sha_resumed)
  message(FATAL_ERROR "the resumed run's final checkpoint differs from the uninterrupted run's")
endif()
string(JSON last GET "${losses_whole}" 3)
string(JSON resumed_last GET "${losses_resumed}" 1)
if(NOT last STREQUAL resumed_last)
  message(FATAL_ERROR "final losses: ${last} uninterrupted, ${resumed_last} resumed")
endif()

# Bad input: named, exit 2, on every rank before any training.
execute_process(COMMAND ${mpirun} ${FUSEDOPT} train --dist --model transformer_small --batch-size 3
                        --steps 1 --quiet
                RESULT_VARIABLE rc ERROR_VARIABLE err TIMEOUT 60)
if(rc EQUAL 0 OR NOT err MATCHES "--batch-size 3 with --dist: must divide by the 2 ranks")
  message(FATAL_ERROR "train --dist --batch-size 3: exit '${rc}'\n${err}")
endif()
execute_process(COMMAND ${FUSEDOPT} train --dist --compare --quiet RESULT_VARIABLE rc
                ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--dist reports as text")
  message(FATAL_ERROR "train --dist --compare: exit '${rc}'\n${err}")
endif()
