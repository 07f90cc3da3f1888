# Sourced by run.sh: `stage NAME OUTPUT COMMAND...` runs a pipeline stage, or reuses it when it already ran.
#
# Its stamp, $OUT/.stages/NAME (the key, then the seconds the run took), is written only once the command
# has finished. A stage is reused (not run) when FRESH is not 1, its stamp holds the same key, OUTPUT (the
# file or folder it writes) is still there, and no stage before it ran in this invocation: each stage reads
# the ones before (data -> sft -> rm ...), so once one runs, every later one runs too. The key is the command
# and a checksum of every file the command names (a script, a config, a dataset), so an edited input runs
# its stage again, and CODE_KEY when it is set: run.sh sets it to `code_key agentrl envs rewards`, so an
# edit to code the commands import without naming it (a git pull, a changed env) runs every stage again.
# Each run appends "NAME SECONDS" to $TIMES.

# code_key DIR...: one checksum of the path and content of every .py file under the folders.
code_key() {
  find "$@" -name '*.py' -type f -print0 | LC_ALL=C sort -z | xargs -0 cksum | cksum
}

# stage_key OUTPUT COMMAND...: the command, quoted, then the checksum and size of each argument that is a file,
# but OUTPUT and what lies in it (written by the run, so present only after it).
stage_key() {
  local output=$1 arg sums=""
  shift
  for arg in "$@"; do
    if [[ -f $arg && $arg != "$output" && $arg != "$output"/* ]]; then sums+=" $(cksum < "$arg")"; fi
  done
  printf '%q ' "$@"
  printf '|%s' "$sums"
  if [[ -n ${CODE_KEY:-} ]]; then printf '|code %s' "$CODE_KEY"; fi
}

stage() {
  local name=$1 output=$2; shift 2
  local stamp="$OUT/.stages/$name" key
  key=$(stage_key "$output" "$@")
  if [[ $FRESH != 1 && -f $stamp && -e $output && "$(head -n 1 "$stamp")" == "$key" ]]; then
    echo "$name $(tail -n 1 "$stamp")" >> "$TIMES"
    echo "=== $name: reused (the same command, on the same files, ran to the end in $OUT; FRESH=1 runs it again)" >&2
    return
  fi
  FRESH=1  # every later stage runs: its input may have changed
  rm -f "$stamp"
  echo "=== $name: $*" >&2
  local t0=$SECONDS
  "$@"
  echo "$name $((SECONDS - t0))" >> "$TIMES"
  printf '%s\n%s\n' "$key" "$((SECONDS - t0))" > "$stamp"
  echo "=== $name done in $((SECONDS - t0)) s" >&2
}
