"""A completion request of any wire format read as the OpenAI request it stands for
(:func:`cost_view`), so that one reader (:mod:`streamsafe.request_cost`) tells what every
request costs the engine: Anthropic's Messages as the chat vLLM makes of it, the Responses API's
``input`` as a chat's messages, Llama Stack's native requests by their own field names.
"""

from __future__ import annotations

from collections.abc import Mapping

from streamsafe.gateway.upstream.wire import Wire

__all__ = ["cost_view", "messages_view"]


def cost_view(wire: Wire, body: Mapping[str, object]) -> tuple[Mapping[str, object], bool]:
    """``body`` as the OpenAI request it stands for, and whether that is a chat, for reading
    its engine memory and whether its answer is determined
    (:mod:`streamsafe.request_cost`, which reads the numbers as vLLM and Llama Stack do:
    leniently). Responses' ``input`` and ``max_output_tokens`` read as a chat's messages and
    limit; Llama Stack's native requests name their prompt ``content``, their limit
    ``sampling_params.max_tokens`` (Llama Stack sends its provider's ``max_tokens``, 4096 by
    default, where none is given) and greedy sampling ``sampling_params.strategy``."""
    if wire is Wire.OPENAI_CHAT:
        return body, True
    if wire is Wire.OPENAI_COMPLETION or wire is Wire.OPENAI_POOLING:
        return body, False
    if wire is Wire.ANTHROPIC_MESSAGES:
        return messages_view(body), True
    if wire is Wire.OPENAI_RESPONSES:
        given = body.get("input")
        messages = given if isinstance(given, list) else [{"role": "user", "content": given}]
        view: dict[str, object] = {
            "messages": messages,
            "max_tokens": body.get("max_output_tokens"),
        }
        view.update((k, body[k]) for k in ("temperature", "seed") if k in body)
        return view, True
    params = body.get("sampling_params")
    params = params if isinstance(params, dict) else {}
    limit = params.get("max_tokens")
    view = {"max_tokens": 4096 if limit is None else limit}
    strategy = params.get("strategy")
    if isinstance(strategy, dict) and strategy.get("type") == "greedy":
        view["temperature"] = 0
    if wire is Wire.LLAMA_STACK_CHAT:
        view["messages"] = body.get("messages")
        return view, True
    view["prompt"] = body.get("content")
    return view, False


def messages_view(body: Mapping[str, object]) -> dict[str, object]:
    """An Anthropic Messages request as the OpenAI chat vLLM makes of it: ``system`` the first
    message, the same ``max_tokens`` and ``temperature`` (Anthropic has no ``seed``)."""
    given = body.get("messages")
    messages = list(given) if isinstance(given, list) else []
    system = body.get("system")
    if system:
        messages.insert(0, {"role": "system", "content": system})
    view: dict[str, object] = {"messages": messages, "max_tokens": body.get("max_tokens")}
    if "temperature" in body:
        view["temperature"] = body["temperature"]
    return view
