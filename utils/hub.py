"""Can the Hugging Face Hub (or another host) be reached? Bounded checks used before any download."""
from __future__ import annotations

import os
import threading

HUB_TIMEOUT_S = 5.0  # the hub clients themselves retry for ~25 s before giving up
OFFLINE_FLAGS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def offline_reason() -> str | None:
    """Why the Hugging Face libraries are in offline mode, if an environment flag says so."""
    for name in OFFLINE_FLAGS:
        if os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{name}={os.environ[name]} is set"
    return None


def hub_problem(repo_id: str, repo_type: str = "model") -> tuple[str, str] | None:
    """None when `repo_id` ("dataset" or "model") answers on the Hub within HUB_TIMEOUT_S (DNS
    included); else (kind, reason) with kind "offline", "missing" (not found or gated) or
    "unreachable"."""
    reason = offline_reason()
    if reason:
        return "offline", reason
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf_errors

    api = HfApi()
    info = api.dataset_info if repo_type == "dataset" else api.model_info
    answer: list[tuple[str, str] | None] = []

    def ask() -> None:
        try:
            info(repo_id, timeout=HUB_TIMEOUT_S)
            answer.append(None)
        except (hf_errors.RepositoryNotFoundError, hf_errors.GatedRepoError) as e:
            answer.append(("missing", f"not found on the Hugging Face Hub or not accessible ({type(e).__name__}; "
                                      f"gated repos need `hf auth login`)"))
        except hf_errors.HfHubHTTPError as e:
            answer.append(("unreachable", f"the Hub answered with an error ({str(e).splitlines()[0][:200]})"))
        except Exception as e:  # noqa: BLE001 - connection refused, DNS failure, timeout, ...
            answer.append(("unreachable", f"the Hub is unreachable ({type(e).__name__}: {str(e)[:200]})"))

    t = threading.Thread(target=ask, daemon=True)  # a thread bounds DNS lookups too, which requests does not
    t.start()
    t.join(HUB_TIMEOUT_S + 1)
    if not answer:
        return "unreachable", f"the Hub did not answer within {HUB_TIMEOUT_S:.0f} s"
    return answer[0]


def host_reachable(host: str, port: int = 443, timeout_s: float = HUB_TIMEOUT_S) -> bool:
    """Whether a TCP connection to host:port opens within timeout_s (DNS included)."""
    import socket
    answer: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            answer.append(True)
        except OSError:
            answer.append(False)

    t = threading.Thread(target=connect, daemon=True)  # bounds the DNS lookup, which the timeout does not
    t.start()
    t.join(timeout_s + 1)
    return bool(answer and answer[0])
