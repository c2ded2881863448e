#!/bin/sh
# Installs dependencies, builds, and runs the tests. The README's test command.
#
#   deploy/test.sh                 gcc build in build/, then every ctest test (unit and
#                                  integration): what a developer runs
#   deploy/test.sh --full          every stage below, in order: what CI runs (.ci/run)
#   deploy/test.sh --stage S[,S]   only the named stages (e.g. --stage asan,fuzz)
#
# Stages (docs/reliability.md "## Bad input" records their findings and times):
#   gcc       build/ with gcc; every test
#   asan      build-asan/ with clang (which makes it the clang -Werror build of everything,
#             benchmarks included), -fsanitize=address,undefined; every test, the router and
#             workers they start included; leaks fail a test
#   tsan      build-tsan/ with clang, -fsanitize=thread; the integration tests (NNG's threads
#             and libuv's loop together: router, workers and test clients)
#   valgrind  the unit tests of build/ under valgrind memcheck, with TANDEM_TEST_QUICK=1
#             (test_tiny's smaller workload): any error, or a definite leak, fails the test
#   fuzz      build-fuzz/ with clang and libFuzzer; every harness in fuzz/ for
#             TANDEM_FUZZ_SECONDS (default 10) from its committed corpus
#
# With more than one stage, the builds of the later stages run in the background at nice 19
# while the gcc stage's tests run: those mostly wait on processes and timers, so the CPU is
# otherwise idle (build logs: build-logs/). Each stage waits for its own build only, so the
# tsan and fuzz builds go on during the asan tests. Every build has -DTANDEM_KV_CHECK=ON (the
# workers check their KV cache after every step, docs/engine.md), so the integration tests check
# the KV invariants in every stage. TANDEM_CMAKE_FLAGS is passed to every cmake configure after
# it (CI: -DTANDEM_WERROR=ON); TANDEM_SAN_TEST_JOBS is the ctest -j of the asan and
# tsan stages (default: cores + 1). Every stage runs even when an earlier one failed; the
# exit status is non-zero if any failed, and a table of stage times ends the output.
set -eu
cd "$(dirname "$0")/.."

stages=gcc
build_only=""
case "${1:-}" in
--full) stages="gcc asan tsan valgrind fuzz" ;;
--stage) stages=$(echo "${2:?--stage needs a list, e.g. asan,fuzz}" | tr ',' ' ') ;;
--build-only) build_only=1 stages=${2:?} ;; # internal: the background builds
"") ;;
*)
	echo "usage: deploy/test.sh [--full | --stage gcc,asan,tsan,valgrind,fuzz]" >&2
	exit 2
	;;
esac
for s in $stages; do
	case $s in
	gcc | asan | tsan | valgrind | fuzz) ;;
	*)
		echo "deploy/test.sh: unknown stage $s (gcc, asan, tsan, valgrind, fuzz)" >&2
		exit 2
		;;
	esac
done

jobs=$(nproc)
# The sanitizer stages' tests spend much of their time waiting on processes and timers (the
# integration tests), so one more than the cores keeps the CPU busy.
san_jobs=${TANDEM_SAN_TEST_JOBS:-$((jobs + 1))}
flags="-DTANDEM_KV_CHECK=ON ${TANDEM_CMAKE_FLAGS:-}"
src=$(pwd)
supp=$src/tests/sanitizers
summary=""
failed=""

now() { date +%s; }

# build_stage STAGE: configures and builds the stage's build directory.
build_stage() {
	# shellcheck disable=SC2086
	case $1 in
	gcc | valgrind)
		CC=${CC:-gcc} cmake -S . -B build $flags >/dev/null &&
			cmake --build build -j"$jobs"
		;;
	asan)
		CC=clang cmake -S . -B build-asan $flags -DTANDEM_SANITIZER=address,undefined \
			>/dev/null && cmake --build build-asan -j"$jobs"
		;;
	tsan)
		CC=clang cmake -S . -B build-tsan $flags -DTANDEM_SANITIZER=thread \
			-DTANDEM_BUILD_BENCH=OFF >/dev/null && cmake --build build-tsan -j"$jobs"
		;;
	fuzz)
		CC=clang cmake -S . -B build-fuzz $flags -DTANDEM_FUZZ=ON -DTANDEM_BUILD_TESTS=OFF \
			-DTANDEM_BUILD_BENCH=OFF -DTANDEM_FUZZ_SECONDS="${TANDEM_FUZZ_SECONDS:-10}" \
			>/dev/null && cmake --build build-fuzz -j"$jobs"
		;;
	esac
}

# The unit tests under valgrind, nproc at a time, each with the environment and working
# directory ctest gives it (tandem_test in cmake/TandemHelpers.cmake). test_tiny is left out:
# its tests run the 512-wide, 8-layer preset model, which valgrind does not finish in 10
# minutes; that code (engine/tiny.c, engine/kernels.c) runs under ASan+UBSan in the asan
# stage and under fuzz_checkpoint. test_search is left out too: its rate and P:D searches
# run dozens of offline simulations, 200 s under valgrind (2026-12-02) for code that
# test_simulate already runs under valgrind; it runs under ASan+UBSan in the asan stage.
# Each test is stopped after 10 minutes (a failure), so a hang cannot stall CI.
valgrind_units() {
	logs=$src/build/valgrind
	mkdir -p "$logs"
	rm -f "$logs"/*.log "$logs"/*.failed
	# test_tiny first: the longest (about 2 minutes with TANDEM_TEST_QUICK), the rest beside it.
	# shellcheck disable=SC2016 # the inner sh expands them
	{
		echo test_tiny
		ctest --test-dir build -N -L unit | sed -n 's/^ *Test *#[0-9]*: \(.*\)$/\1/p' |
			grep -vx -e test_tiny -e test_search
	} |
		xargs -P "$jobs" -I{} sh -c '
			src=$1 t=$2 logs=$1/build/valgrind
			if (cd "$src/build/tests" && TANDEM_BIN_DIR=$src/build/bin TANDEM_SOURCE_DIR=$src \
				TANDEM_TEST_QUICK=1 timeout 600 valgrind -q --leak-check=full \
				--suppressions="$1/tests/sanitizers/valgrind.supp" \
				--errors-for-leak-kinds=definite --show-leak-kinds=definite \
				--error-exitcode=99 "./$t") >"$logs/$t.log" 2>&1
			then echo "valgrind: $t ok"
			else echo "valgrind: $t FAILED (log: $logs/$t.log)"; : >"$logs/$t.failed"
			fi' sh "$src" {}
	if ls "$logs"/*.failed >/dev/null 2>&1; then
		for f in "$logs"/*.failed; do
			t=$(basename "$f" .failed)
			echo "---- valgrind: $t"
			tail -n 60 "$logs/$t.log"
		done
		return 1
	fi
}

if [ -n "$build_only" ]; then
	build_stage "$stages"
	exit
fi

# test_stage STAGE: runs the stage's tests.
test_stage() {
	case $1 in
	gcc) ctest --test-dir build --output-on-failure -j"$jobs" ;;
	asan)
		ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1 \
			LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0 \
			UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
			ctest --test-dir build-asan --output-on-failure -j"$san_jobs"
		;;
	tsan)
		TSAN_OPTIONS="suppressions=$supp/tsan.supp second_deadlock_stack=1" \
			ctest --test-dir build-tsan -L integration --output-on-failure -j"$san_jobs"
		;;
	valgrind) valgrind_units ;;
	fuzz) ctest --test-dir build-fuzz -L fuzz --output-on-failure -j"$jobs" ;;
	esac
}

# record STAGE BUILD_SECONDS TEST_SECONDS RESULT
record() {
	summary="$summary$(printf '%-9s %6ss %6ss  %s' "$1" "$2" "$3" "$4")
"
	if [ "$4" != ok ]; then
		failed="$failed $1"
	fi
}

t_all=$(now)
t=$(now)
./deploy/install-deps.sh
record deps "$(($(now) - t))" 0 ok

bg=""
for s in $stages; do
	echo "==== stage $s"
	tb=$(now)
	st=ok
	# A stage built in the background waits for its own build only; the later
	# builds go on (at nice 19) during its tests.
	case $s in
	asan | tsan | fuzz)
		while [ -n "$bg" ] && [ ! -e "build-logs/$s.done" ] && kill -0 "$bg" 2>/dev/null; do
			sleep 1
		done
		;;
	esac
	build_stage "$s" || st="build failed"
	tt=$(now)
	# Once build/ is built, the other stages' builds start in the background.
	if [ "$s" = gcc ] && [ "$stages" != gcc ]; then
		mkdir -p build-logs
		rm -f build-logs/*.done
		(
			for b in $stages; do
				case $b in
				asan | tsan | fuzz)
					nice -n 19 "$src/deploy/test.sh" --build-only "$b" >"build-logs/$b.log" 2>&1 ||
						true
					: >"build-logs/$b.done"
					;;
				esac
			done
		) &
		bg=$!
	fi
	if [ "$st" = ok ]; then
		test_stage "$s" || st="tests failed"
	fi
	record "$s" "$((tt - tb))" "$(($(now) - tt))" "$st"
done
[ -z "$bg" ] || wait "$bg" || true

echo "==== stage     build   tests  result"
printf '%s' "$summary"
echo "total     $(($(now) - t_all))s"
if [ -n "$failed" ]; then
	echo "deploy/test.sh: FAILED:$failed" >&2
	exit 1
fi
