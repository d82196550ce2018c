"""A LangChain `AgentMiddleware` as one of the loop's round policies.

`LoopConfig(middleware=[...])` takes `langchain.agents.middleware` instances;
each runs inside `call_model`, so a round still costs one checkpoint:

    before_model     with the round's state, before the view is assembled: a
                     `messages` update (PII redaction, say) is written to the
                     transcript with the reply and is what this round's view
                     is built from; other keys are written to state;
                     `jump_to: "end"` answers the round with the update's
                     messages (no model call); where `assemble_context` is a
                     step of its own, it shows the view before this hook, and
                     `call_model` sends one built after it
    wrap_model_call  around the loop's own call (fallbacks, token accounting,
                     thinking knobs, cache breakpoints are inside it), with
                     LangChain's `ModelRequest`; its `awrap_model_call` in an
                     async run (a middleware with only the sync form runs it on
                     a worker thread)
    after_model      with the reply appended to the state: an `AIMessage` under
                     the reply's id replaces the reply, `ToolMessage`s answer
                     calls so that they never run, other messages follow them,
                     other keys are written to state, `jump_to: "end"` ends
                     the turn after them; it may interrupt (a person's review):
                     the round's reply is then recorded (`nodes.loop.chain`), and
                     the resume goes on from it
    wrap_tool_call   around each tool call, inside the restricted-session guard
                     (`nodes.tools.node`), so no middleware can run a tool a
                     restricted session may not

`before_model` and `after_model` run their sync form (on a worker thread in
an async run). `before_agent` / `after_agent` are refused at build time: the
loop's turn has its own start and end (`TurnEnd`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import TYPE_CHECKING, Any, cast

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
from langchain_core.messages.ai import UsageMetadata

from nodes.core.policy import CallModel, CallSteps, ModelCall, Reply, Round, RoundPolicy
from nodes.core.reducers import add_messages
from nodes.core.stages import Stages
from nodes.kernel.steps import Either, Work, adrive, drive
from nodes.kernel.tool_results import vetoed_result
from nodes.token_accounting.aside import add_aside, measured, measuring, unmeasured
from nodes.token_accounting.state import TokenUsageState

if TYPE_CHECKING:
    from langchain.agents.middleware import AgentMiddleware, ModelResponse
    from langchain.agents.middleware import ModelRequest as LangChainRequest

    from nodes.core.loop import Loop
    from nodes.core.state import LoopState

AGENT_HOOKS = ("before_agent", "abefore_agent", "after_agent", "aafter_agent")
JUMPS = ("end",)


def overrides(middleware: AgentMiddleware, hook: str) -> bool:
    """Whether `middleware` has its own `hook` (LangChain's base ones do nothing)."""
    from langchain.agents.middleware import AgentMiddleware

    return getattr(type(middleware), hook) is not getattr(AgentMiddleware, hook)


def check_middleware(middleware: AgentMiddleware, index: int, restricted_tools: Set[str]) -> None:
    """Refuse what the loop cannot run, naming the entry (`LoopConfig` checked its type).

    Raises:
        ValueError: it has agent-level hooks, jumps somewhere other than the end, rewrites
            the transcript (`SummarizationMiddleware`), or always offers a tool that
            restricted sessions may not use (`LLMToolSelectorMiddleware`).
    """
    from langchain.agents.middleware import LLMToolSelectorMiddleware, SummarizationMiddleware

    where = f"middleware[{index}] ({middleware.name})"
    if isinstance(middleware, SummarizationMiddleware):
        # It removes the transcript's messages and writes its summary as an unnamed human
        # message, which a group's view would attribute to the owner.
        raise ValueError(
            f"{where}: the loop compacts its own view and keeps the transcript whole; "
            "use the Compaction feature (max_context_tokens, compactor) instead"
        )
    if isinstance(middleware, LLMToolSelectorMiddleware) and (
        unusable := sorted(set(middleware.always_include) - set(restricted_tools))
    ):
        raise ValueError(
            f"{where}: always_include names {unusable}, which group and stranger sessions "
            "are not offered (restricted_tools): every such turn would fail; add them to "
            "restricted_tools or leave them out of always_include"
        )
    agent_hooks = [hook for hook in AGENT_HOOKS if overrides(middleware, hook)]
    if agent_hooks:
        raise ValueError(
            f"{where} has {', '.join(agent_hooks)}: the loop "
            "runs before_model, after_model, wrap_model_call and wrap_tool_call (a turn's "
            "end is the TurnEnd hook)"
        )
    for hook in ("before_model", "after_model"):
        jumps = getattr(getattr(type(middleware), hook), "__can_jump_to__", None) or ()
        if unknown := [jump for jump in jumps if jump not in JUMPS]:
            raise ValueError(
                f'{where}.{hook} may jump to {unknown}: the loop takes jump_to="end" only'
            )


class MiddlewareHooks(RoundPolicy):
    """One `AgentMiddleware`'s model hooks in the round (see the module docstring)."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        config = loop.config
        for index, middleware in enumerate(config.middleware):
            check_middleware(middleware, index, config.restricted_tools)
        return [cls(middleware) for middleware in config.middleware]

    def __init__(self, middleware: AgentMiddleware[Any, Any, Any]) -> None:
        self.middleware = middleware
        self._before = overrides(middleware, "before_model")
        self._after = overrides(middleware, "after_model")
        self._sync_wrap = overrides(middleware, "wrap_model_call")
        self._async_wrap = overrides(middleware, "awrap_model_call")

    @property
    def name(self) -> str:
        return self.middleware.name

    def has(self, hook: str) -> bool:
        return {
            "before_model": self._before,
            "after_model": self._after,
            "wrap_model_call": self._sync_wrap or self._async_wrap,
        }[hook]

    def before_model(self, round: Round) -> None:
        update, usage = measured(self.middleware.before_model, _state(round), round.runtime)
        _count(round, usage)
        update = update or {}
        messages, jump, rest = _split(update)
        if messages:
            # The view is built from the rewritten transcript, even where `assemble_context`
            # published one as a step of its own before this hook ran.
            merged = add_messages(list(round.messages), messages)
            _see(round, {**rest, "messages": merged, "model_view": None})
        else:
            _see(round, rest)
        if jump == "end":
            round.answer(messages=messages, **rest)
        else:
            round.write(**({"messages": messages} if messages else {}), **rest)

    def wrap_model_call(self, round: Round, request: ModelCall, call: CallModel) -> CallSteps:
        asked = _langchain_request(round, request)

        # The wrapper's own model calls count as the middleware's; the reply it hands on
        # to is counted inside, as a reply.
        def handler(changed: LangChainRequest) -> ModelResponse:
            with unmeasured():
                return _response(drive(call(_our_call(request, changed))))

        async def ahandler(changed: LangChainRequest) -> ModelResponse:
            with unmeasured():
                return _response(await adrive(call(_our_call(request, changed))))

        async def ameasured() -> tuple[Any, UsageMetadata | None]:
            with measuring() as spent:
                result = await self.middleware.awrap_model_call(asked, ahandler)
            return result, spent()

        wrap = self.middleware.wrap_model_call
        if self._async_wrap and self._sync_wrap:
            step: Any = Either(lambda: measured(wrap, asked, handler), ameasured)
        elif self._sync_wrap:  # the inner steps run in place, on a worker thread
            step = Work(measured, (wrap, asked, handler), blocks=True)
        else:
            step = Either(lambda: _async_only(self.name), ameasured)
        result, usage = yield step
        _count(round, usage)
        return _reply_of(result)

    def after_model(self, round: Round, reply: Reply) -> None:
        state = {**_state(round), "messages": [*round.messages, reply.message]}  # with the reply
        update, usage = measured(self.middleware.after_model, state, round.runtime)
        _count(round, usage)
        update = update or {}
        messages, jump, rest = _split(update)
        for message in messages:
            if isinstance(message, AIMessage) and message.id == reply.message.id:
                reply.message = message
            elif isinstance(message, ToolMessage):
                reply.close([message])
            else:
                reply.follow.append(message)
        if jump == "end":
            ended = f"{self.name} ended the turn"
            reply.close([vetoed_result(call, ended) for call in reply.calls_to_run()])
        _see(round, rest)
        round.write(**rest)


def _count(round: Round, usage: UsageMetadata | None) -> None:
    """A hook's own model calls, counted as the middleware's (`token_usage["purposes"]`)."""
    stored = cast(TokenUsageState, round.state).get("token_usage")
    add_aside(round.update, stored, "middleware", usage)


def _state(round: Round) -> Any:
    """The state a hook reads (LangChain's `AgentState`, with the loop's keys)."""
    return {**round.state, "messages": list(round.messages)}


def _see(round: Round, update: Mapping[str, Any]) -> None:
    """Let the rest of the round (later hooks, the view) read what a hook wrote."""
    round.state = cast("LoopState", {**round.state, **update})


def _split(update: Mapping[str, Any]) -> tuple[list[BaseMessage], str | None, dict[str, Any]]:
    """A hook's update as (messages, where it jumps, the other keys)."""
    rest = dict(update)
    messages = rest.pop("messages", None) or []
    return list(messages), rest.pop("jump_to", None), rest


def _langchain_request(round: Round, request: ModelCall) -> LangChainRequest:
    from langchain.agents.middleware import ModelRequest as LangChainRequest

    return LangChainRequest(
        model=request.model,
        messages=cast(Any, list(request.view)),
        tools=list(request.tools),
        tool_choice=request.tool_choice,
        state=_state(round),
        runtime=cast(Any, round.runtime),
        model_settings=dict(request.settings),
    )


def _our_call(request: ModelCall, changed: LangChainRequest) -> ModelCall:
    """The loop's call as a middleware changed it (its system message leads the view)."""
    leading: Sequence[BaseMessage] = (
        [changed.system_message] if isinstance(changed.system_message, SystemMessage) else []
    )
    return request.override(
        model=changed.model,
        view=[*leading, *changed.messages],
        tools=list(changed.tools),
        tool_choice=changed.tool_choice,
        settings=dict(changed.model_settings),
    )


def _response(message: BaseMessage) -> ModelResponse:
    from langchain.agents.middleware import ModelResponse

    return ModelResponse(result=[message])


def _reply_of(result: Any) -> BaseMessage:
    """The reply in what a wrapper returned: an `AIMessage`, a `ModelResponse`, or an
    `ExtendedModelResponse` around one."""
    response = getattr(result, "model_response", result)
    if isinstance(response, BaseMessage):
        return response
    replies = [m for m in getattr(response, "result", []) if isinstance(m, AIMessage)]
    if not replies:
        raise TypeError(f"a middleware's wrap_model_call returned no AIMessage: {result!r}")
    return replies[-1]


def _async_only(name: str) -> Any:
    raise TypeError(
        f"middleware {name} has only awrap_model_call: run the graph with ainvoke/astream"
    )
