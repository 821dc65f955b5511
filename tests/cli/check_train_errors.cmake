# cli.train_errors: `fusedopt train` on bad input (issue #11, items 7, 9, 13, 21). NaN
# hyper-parameters are errors (not "use the default"); report and trace files that cannot be
# written are errors naming the path; a failed run leaves no trace file; an empty or malformed
# digits file is named; --dataset/--num-classes (bench-train's spelling) and the old
# --data/--classes both work. Run with -DFUSEDOPT=<the CLI> -DWORK_DIR=<a scratch dir>
# -DFOPT_CMAKE_DIR=<cmake/>.
include(${FOPT_CMAKE_DIR}/FoptCheckJson.cmake)
set(dir ${WORK_DIR}/cli_train_errors)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
set(tiny --model mobilenet_v1 --image-size 8 --num-classes 10 --batch-size 2 --steps 2 --warmup 0
         --quiet)

# NaN (and other non-finite) hyper-parameters: exit 2 naming the option and the value.
foreach(bad "--lr;nan" "--lr;inf" "--weight-decay;nan" "--weight-decay;-1")
  list(GET bad 0 option)
  list(GET bad 1 value)
  expect_exit(2 "fusedopt train: error: .*${option}.*${value}" ${FUSEDOPT} train ${tiny} ${bad})
endforeach()

# --state-dtype: a dtype the states cannot take, and 8-bit states for AdamP (whose sums are per row
# of a tensor).
expect_exit(2 "fusedopt train: error: .*--state-dtype f16" ${FUSEDOPT} train ${tiny}
            --state-dtype f16)
expect_exit(2 "fusedopt train: error: .*--state-dtype q8.*adamp" ${FUSEDOPT} train ${tiny}
            --optimizer adamp --state-dtype q8)

# Unwritable outputs: a full device and a folder below a regular file (works as root too).
file(WRITE ${dir}/a_file "")
set(blocked ${dir}/a_file/sub)
foreach(bad "--json;/dev/full" "--trace;/dev/full" "--json;${blocked}/r.json"
            "--markdown;${blocked}/t.md" "--chart;${blocked}/c.png" "--trace;${blocked}/t.json")
  list(GET bad 1 path)
  expect_exit(NONZERO "error: .*${path}.*(No space left on device|Not a directory)"
              ${FUSEDOPT} train ${tiny} ${bad})
  if(out MATCHES "report:|table:|chart:|trace:")
    message(FATAL_ERROR "train ${bad} says it wrote a file:\n${out}")
  endif()
endforeach()

# A run that fails leaves no trace file (it used to leave an empty one).
expect_exit(2 "--impl.*jax" ${FUSEDOPT} train ${tiny} --impl jax --trace ${dir}/failed.json)
expect_exit(2 "unknown.*imagenet" ${FUSEDOPT} train ${tiny} --dataset imagenet
            --trace ${dir}/failed.json)
if(EXISTS ${dir}/failed.json)
  message(FATAL_ERROR "a failed run left ${dir}/failed.json behind")
endif()

# The digits file: empty, or malformed, is named with its path.
file(WRITE ${dir}/empty.csv "")
expect_exit(2 "empty.csv.*(empty|no rows)" ${FUSEDOPT} train ${tiny} --dataset digits
            --digits-csv ${dir}/empty.csv)
file(WRITE ${dir}/bad.csv "1,2,x\n")
expect_exit(2 "bad.csv.*line 1" ${FUSEDOPT} train ${tiny} --dataset digits
            --digits-csv ${dir}/bad.csv)

# One spelling for train and bench-train (--dataset, --num-classes); the old one still works.
expect_exit(0 "" ${FUSEDOPT} train --model mobilenet_v1 --image-size 8 --classes 10 --data synthetic
            --batch-size 2 --steps 1 --warmup 0 --quiet --json ${dir}/alias.json
            --trace ${dir}/ok_trace.json)
file(READ ${dir}/alias.json json)
expect_key("${json}" synthetic data)
file(READ ${dir}/ok_trace.json trace)
expect_key("${json}" "*" numel)
expect_key("${trace}" 1 otherData fusedopt_trace)
file(GLOB leftovers ${dir}/*.tmp*)
if(leftovers)
  message(FATAL_ERROR "temporary files left behind: ${leftovers}")
endif()
