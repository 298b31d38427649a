"""One request's state inside the serving engine (vLLM v1's ``Request``).

A :class:`Request` is made by :meth:`~poot.engine.llm_engine.LLMEngine.add_request` and then
owned by the engine thread: the :class:`~poot.engine.scheduler.Scheduler` moves it between
its queues and gives it KV blocks and a token-history row, the runner computes its tokens,
and the :class:`~poot.engine.output_processor.OutputProcessor` turns each sampled token into
a :class:`~poot.engine.output_processor.RequestOutput`. Its ``status`` is one of
:data:`WAITING`, :data:`PREFILL`, :data:`RUNNING`, :data:`FINISHED`.
"""

from __future__ import annotations

import queue
from dataclasses import asdict, dataclass

from poot.engine.stops import StopMatcher
from poot.sampling_params import SamplingParams
from poot.text.stream import StreamDecoder

#: Queued for admission (new, or preempted: then it holds no block and no history row).
WAITING = "waiting"
#: Admitted; prompt tokens still to be prefilled (all but the last, which decode feeds).
PREFILL = "prefill"
#: Admitted and decoding: one token per decode step.
RUNNING = "running"
#: Ended (stop, length, abort, error); it holds nothing.
FINISHED = "finished"


@dataclass
class RequestStats:
    """Final numbers of one request (seconds). ``generated_tokens`` counts every sampled
    token (a stop token included); ``cached_tokens``: prompt tokens whose K/V came from the
    prefix cache; ``ttft_s``: arrival to first sampled token; ``decode_tokens_per_s`` over
    the tokens after the first (None for fewer than two); ``guided_masks`` /
    ``guided_mask_s``: allowed-token masks a guided request computed on the host, and their
    seconds. Speculative decoding (:mod:`poot.engine.spec`): ``draft_tokens`` proposed,
    ``accepted_tokens`` of them accepted, in ``verify_steps`` steps; ``acceptance_rate``
    (accepted / proposed) and ``mean_accepted_length`` (tokens per verify step, the target's
    own included: 1 + accepted / steps), None without a verify step."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float = 0.0
    decode_tokens_per_s: float | None = None
    total_s: float = 0.0
    queue_s: float = 0.0
    prefill_steps: int = 0
    preemptions: int = 0
    finish_reason: str = ""
    pipelined: bool = False
    guided_masks: int = 0
    guided_mask_s: float = 0.0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class Request:
    """One request's state in the engine (engine thread only, but ``sink``).

    Args:
        rid: its id. prompt: its token ids. params: its sampling parameters.
        tokenizer: the engine's (None: no text, no tokenizer stop ids).
        arrival: ``time.perf_counter()`` when it was added.
        sink: where its outputs also go (``put(RequestOutput)``), or None.
    """

    def __init__(self, rid: str, prompt: list[int], params: SamplingParams, tokenizer,
                 arrival: float, sink: queue.Queue | None):
        self.id, self.params = rid, params
        self.prompt = prompt
        self.tokens = list(prompt)           # prompt + generated (the last is fed next)
        self.output_ids: list[int] = []
        self.blocks: list[int] = []
        self.table = None                    # i32 [W]: blocks, then the null block
        self.n_computed = 0                  # positions whose K/V are in the blocks
        self.keys: list[bytes] = []          # chain keys of the full blocks computed
        self.status = WAITING
        self.history_row: int | None = None
        self.uniforms = params.uniforms()
        self.stop_ids = set(params.stop_token_ids)
        if tokenizer is not None and not params.ignore_eos:
            self.stop_ids |= set(tokenizer.stop_ids)
        self.decoder = StreamDecoder(tokenizer, skip_special_tokens=True, context=prompt) \
            if tokenizer is not None and params.detokenize else None
        self.matcher = StopMatcher(params.stop)
        self.sink = sink
        self.guide = None                    # TokenMatcher of a guided request
        self.spec = None                     # SpecState while it speculates (poot.engine.spec)
        self.lora_slot = 0                   # LoRA slot (0: the base model)
        self.lora_salt = ""                  # prefix-cache salt of its adapter
        self.stats = RequestStats(prompt_tokens=len(prompt))
        self.t_arrival = arrival
        self.t_admitted: float | None = None
        self.t_first: float | None = None
        self.generated = 0
        self.aborted = False


__all__ = ["FINISHED", "PREFILL", "RUNNING", "Request", "RequestStats", "WAITING"]
