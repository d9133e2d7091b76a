#!/usr/bin/env bash
# The paper's setting on verl (Chen, Ban, Hsieh 2026, "ReSPO"): G = 8 responses per prompt,
# mini-batch B = 32 prompts, rollout-reuse ratio N in {8, 16, 32} (one rollout step samples N*32
# prompts and takes N optimizer steps, so staleness runs 0..N-1), AdamW lr 1e-6 with 5 % warm-up,
# weight decay 0.1, grad clip 1.0, token-mean aggregation, no KL, no entropy bonus, temperature 1.0,
# 1,024 policy updates in total (= 1024 / N rollout steps).
#
# Usage:
#   examples/verl/run_paper.sh --model /path/to/Qwen3-30B-A3B --data data/dapo \
#       [--objective respo] [--reuse 8|16|32] [--gpus 8] [--nodes 1] [--tp 4] \
#       [--max-prompt 1024] [--max-response 15360] [--rollout-is none|token|sequence] \
#       [--project respo] [--name RUN] \
#       [--print-overrides] [-- extra Hydra overrides...]
#
#   --data DIR holds train.parquet and test.parquet, as written by examples/verl/prepare_data.sh.
#   --objective picks the policy loss; the baselines run from the same script:
#       respo | vespo | topr | reinforce | reshaped   respo's objectives, registered with verl
#       m2po  -> respo's M2PO, registered with verl (tau = 0.04; +actor_rollout_ref.actor.policy_loss.m2po_tau=...);
#                selects per micro-batch, i.e. per ppo_max_token_len_per_gpu token budget under dynamic batching
#       opsm  -> respo's OPSM, registered with verl: verl's PPO loss (clip 0.2, dual clip c = 3) on the rows
#                OPSM keeps (delta = 0.5; +actor_rollout_ref.actor.policy_loss.opsm_delta=...)
#       TIS, MIS, IcePop and decoupled PPO are verl's own algorithm.rollout_correction settings (pass them
#       after `--`; docs/method.md gives the mapping)
#       grpo  -> verl's "vanilla" (token PPO clip 0.2, dual clip c = 3)
#       gspo  -> verl's "gspo" (sequence clip 3e-4 / 4e-4, seq-mean-token-mean, pinned: verl 0.9.1's gspo
#                follows loss_agg_mode, and another one after `--` is refused)
#       cispo -> verl's "cispo";  sapo -> verl's "sapo";  gmpo -> verl's "geo_mean" (clip 0.4)
#   --rollout-is turns on verl's training/inference-mismatch correction (rollout_is_weights =
#       pi_old/pi_vllm, truncated at 2); respo's objectives fold it into log W in log space.
#   --print-overrides prints the Hydra overrides one per line and exits (CI composes them with
#   verl's config without a GPU: tests/integrations/test_integration_verl.py).
#
# Kernel hyperparameters: respo's defaults are the paper's; to change them pass, after `--`,
#   actor_rollout_ref.actor.policy_loss._target_=respo.integrations.verl.RespoPolicyLossConfig \
#   +actor_rollout_ref.actor.policy_loss.respo_pos=[2.0,0.5,2.0] +actor_rollout_ref.actor.policy_loss.respo_neg=[1.0,0.5,2.0]
# (this script already sets the _target_ for respo's objectives).
set -euo pipefail

OBJECTIVE=respo
REUSE=8
MODEL=""
DATA=""
NGPUS=8
NNODES=1
TP=1
MAX_PROMPT=1024
MAX_RESPONSE=15360
PROJECT=respo
NAME=""
PRINT=0
ROLLOUT_IS=none
UPDATES=1024
MINI_BATCH=32
GROUP=8

while [[ $# -gt 0 ]]; do
  case "$1" in
    --objective) OBJECTIVE="$2"; shift 2 ;;
    --reuse) REUSE="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --gpus) NGPUS="$2"; shift 2 ;;
    --nodes) NNODES="$2"; shift 2 ;;
    --tp) TP="$2"; shift 2 ;;
    --max-prompt) MAX_PROMPT="$2"; shift 2 ;;
    --max-response) MAX_RESPONSE="$2"; shift 2 ;;
    --rollout-is) ROLLOUT_IS="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --name) NAME="$2"; shift 2 ;;
    --print-overrides) PRINT=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n "2,31p" "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z "$MODEL" || -z "$DATA" ]]; then
  echo "--model and --data are required (see --help)" >&2
  exit 2
fi
if (( UPDATES % REUSE != 0 )); then
  echo "--reuse must divide ${UPDATES} updates, got ${REUSE}" >&2
  exit 2
fi

case "$ROLLOUT_IS" in
  none) ROLLOUT_IS=null ;;
  token|sequence) ;;
  *) echo "--rollout-is must be none, token or sequence, got ${ROLLOUT_IS}" >&2; exit 2 ;;
esac

# Objective -> verl loss_mode, aggregation and clip ranges (defaults as published).
AGG=token-mean
CLIP_LOW=0.2
CLIP_HIGH=0.2
RESPO_TARGET=0
case "$OBJECTIVE" in
  respo|vespo|topr|reinforce|reshaped|m2po|opsm) LOSS_MODE="$OBJECTIVE"; RESPO_TARGET=1 ;;
  grpo) LOSS_MODE=vanilla ;;
  gspo) LOSS_MODE=gspo; AGG=seq-mean-token-mean; CLIP_LOW=3e-4; CLIP_HIGH=4e-4 ;;
  cispo) LOSS_MODE=cispo ;;
  sapo) LOSS_MODE=sapo; AGG=seq-mean-token-mean ;;
  gmpo) LOSS_MODE=geo_mean; CLIP_LOW=0.4; CLIP_HIGH=0.4 ;;
  *) echo "unknown --objective ${OBJECTIVE}" >&2; exit 2 ;;
esac

# verl 0.9.1's gspo follows actor.loss_agg_mode (0.8 and 0.9.0 forced seq-mean-token-mean, the aggregation of the
# GSPO paper and of the ReSPO paper's GSPO baseline): the paper's GSPO keeps it, whatever is passed after `--`.
if [[ "$OBJECTIVE" == gspo ]]; then
  for arg in "$@"; do
    if [[ "$arg" == *actor_rollout_ref.actor.loss_agg_mode=* && "${arg#*=}" != "$AGG" ]]; then
      echo "--objective gspo runs the paper's GSPO with actor_rollout_ref.actor.loss_agg_mode=${AGG} (verl 0.9.1's gspo follows the setting), got ${arg}" >&2
      exit 2
    fi
  done
fi

TRAIN_BATCH=$(( REUSE * MINI_BATCH ))      # prompts per rollout step: N mini-batches of 32
STEPS=$(( UPDATES / REUSE ))               # rollout steps; each takes N optimizer steps
MAX_TOKENS=$(( MAX_PROMPT + MAX_RESPONSE ))
NAME="${NAME:-${OBJECTIVE}-N${REUSE}}"

overrides=(
  "algorithm.adv_estimator=grpo"
  "algorithm.norm_adv_by_std_in_grpo=True"
  "algorithm.use_kl_in_reward=False"
  "algorithm.rollout_correction.rollout_is=${ROLLOUT_IS}"
  "data.train_files=${DATA}/train.parquet"
  "data.val_files=${DATA}/test.parquet"
  "data.train_batch_size=${TRAIN_BATCH}"
  "data.max_prompt_length=${MAX_PROMPT}"
  "data.max_response_length=${MAX_RESPONSE}"
  "data.filter_overlong_prompts=True"
  "data.truncation=error"
  "actor_rollout_ref.model.path=${MODEL}"
  "actor_rollout_ref.model.use_remove_padding=True"
  "actor_rollout_ref.model.enable_gradient_checkpointing=True"
  "actor_rollout_ref.actor.strategy=fsdp2"
  "actor_rollout_ref.actor.policy_loss.loss_mode=${LOSS_MODE}"
  "actor_rollout_ref.actor.loss_agg_mode=${AGG}"
  "actor_rollout_ref.actor.clip_ratio_low=${CLIP_LOW}"
  "actor_rollout_ref.actor.clip_ratio_high=${CLIP_HIGH}"
  "actor_rollout_ref.actor.clip_ratio_c=3.0"
  "actor_rollout_ref.actor.ppo_mini_batch_size=${MINI_BATCH}"
  "actor_rollout_ref.actor.ppo_epochs=1"
  "actor_rollout_ref.actor.shuffle=False"
  "actor_rollout_ref.actor.use_dynamic_bsz=True"
  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$(( 2 * MAX_TOKENS ))"
  "actor_rollout_ref.actor.optim.lr=1e-6"
  "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.05"
  "actor_rollout_ref.actor.optim.weight_decay=0.1"
  "actor_rollout_ref.actor.optim.clip_grad=1.0"
  "actor_rollout_ref.actor.grad_clip=1.0"
  "actor_rollout_ref.actor.use_kl_loss=False"
  "actor_rollout_ref.actor.kl_loss_coef=0.0"
  "actor_rollout_ref.actor.entropy_coeff=0"
  "actor_rollout_ref.rollout.name=vllm"
  "actor_rollout_ref.rollout.n=${GROUP}"
  "actor_rollout_ref.rollout.temperature=1.0"
  "actor_rollout_ref.rollout.top_p=1.0"
  "actor_rollout_ref.rollout.tensor_model_parallel_size=${TP}"
  "actor_rollout_ref.rollout.gpu_memory_utilization=0.7"
  "actor_rollout_ref.rollout.calculate_log_probs=True"
  "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True"
  "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$(( 2 * MAX_TOKENS ))"
  "trainer.total_training_steps=${STEPS}"
  "trainer.total_epochs=1000"
  "trainer.n_gpus_per_node=${NGPUS}"
  "trainer.nnodes=${NNODES}"
  "trainer.project_name=${PROJECT}"
  "trainer.experiment_name=${NAME}"
  "trainer.logger=[console]"
  "trainer.test_freq=-1"
  "trainer.save_freq=-1"
  "trainer.val_before_train=False"
)
if (( RESPO_TARGET )); then
  # respo's PolicyLossConfig subclass: carries the kernel hyperparameters (respo_pos, respo_neg, ...)
  # and makes every worker that builds the actor config import the registration.
  # rollout_is_level tells the fold whether verl's weights are per token or one per sequence.
  overrides+=(
    "actor_rollout_ref.actor.policy_loss._target_=respo.integrations.verl.RespoPolicyLossConfig"
    "+actor_rollout_ref.actor.policy_loss.rollout_is_level=\${algorithm.rollout_correction.rollout_is}"
  )
fi

if (( PRINT )); then
  printf '%s\n' "${overrides[@]}" "$@"
  exit 0
fi

PYTHON="${PYTHON:-python3}"
exec "$PYTHON" -m respo.integrations.verl.main_ppo "${overrides[@]}" "$@"
