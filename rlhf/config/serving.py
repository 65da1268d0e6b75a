"""The ``serving`` section: how replies are generated for chat, the arena and the vote queue."""
from __future__ import annotations

from dataclasses import dataclass

from rlhf.config.fields import Checked, ConfigError, one_of, opt
from rlhf.registry import ENGINE_CHOICES  # the registry of serving backends (imports no library)


@dataclass
class ServingConfig(Checked):
    max_new_tokens: int = opt(128, "Default reply length limit in tokens.")
    temperature: float = opt(0.7, "Default sampling temperature (0 = greedy).")
    top_p: float = opt(0.9, "Default nucleus sampling probability mass.")
    max_message_chars: int = opt(8000, "Longest accepted message or note, in characters.")
    max_context_tokens: int = opt(2048, "Longest prompt fed to the model; older turns are cut first.")
    max_messages: int = opt(200, "Most messages one /chat, /chat/stream or /arena request may carry (more: 422).")
    warmup: bool = opt(True, "Run one short generation at start so the first user does not wait.")
    load_in_4bit: bool = opt(False, "Load the serving base model in 4-bit NF4 (bitsandbytes).")
    max_batch_size: int = opt(32, "Most replies generated together in one batch (continuous batching).")
    queue_size: int = opt(64, "Chat requests that may wait for a batch slot; beyond it the server answers busy.")
    batch_window_ms: float = opt(10.0, "How long an idle server waits for more requests before starting a batch.")
    threads: int = opt(0, "CPU threads of the serving engine (0 = every core, less a running job's share; "
                       "`config show` prints the budget).")
    adaptive_threads: bool = opt(True, "Decode with fewer threads while other processes keep cores busy (a thread "
                                 "sharing its core stalls every decode step); false: always the budget's threads.")
    engine: str = opt("auto", f"{' | '.join(ENGINE_CHOICES)}: what decodes replies (auto: the first that works "
                      "here, proved at start: llama.cpp on CPU when installed, then llama.cpp's safe load, then "
                      "transformers; transformers on CUDA). Training always runs in torch.")
    isolation: str = opt("process", "process | thread: run the engine in its own process (a native fault ends the "
                         "replies in flight, the engine restarts or falls back, the app lives on) or in the app's.")
    kv_cache_tokens: int = opt(4096, "llama.cpp: KV cache cells per context, shared by its replies (a reply "
                               "reserves its prompt + max_new_tokens; at least max_context_tokens + 64).")
    llama_contexts: int = opt(4, "llama.cpp: most contexts (each with its own KV cache) on the one base: versions "
                              "decoding at the same moment; more versions take turns.")
    llama_weights: str = opt("q8_0", "llama.cpp: q8_0 | shipped | q4_0 | f16: the weights llama.cpp serves, "
                             "quantized once (cached) from those torch trains on; shipped: a shipped model's GGUF as "
                             "is (faster alone, slower with several users: BENCHMARKS.md, bench serve). A .gguf base "
                             "is served as is.")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot work (called at load)."""
        one_of("serving.engine", self.engine, ENGINE_CHOICES)
        one_of("serving.isolation", self.isolation, ("process", "thread"))
        one_of("serving.llama_weights", self.llama_weights, ("shipped", "q4_0", "q8_0", "f16"))
        if self.llama_contexts < 1:
            raise ConfigError("serving.llama_contexts must be at least 1")
