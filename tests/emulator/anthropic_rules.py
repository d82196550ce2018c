"""The Anthropic Messages rules the emulator enforces, each answered with the API's 400.

Sources, besides the API reference (docs.anthropic.com/en/api/messages), for
the exact error texts as the API sends them:

- roles: only `user` and `assistant` in `messages` (system text is the
  top-level `system` parameter); consecutive turns of one role are combined
  into one turn, as the reference says today, so they are accepted (the old
  "roles must alternate" 400 is gone), and a conversation may open with either;
- content: every message but a final assistant one has content, and no text
  block is empty or blank (anthropics/claude-code#6774, #59812);
- tool pairing: an assistant turn's `tool_use` blocks are answered by
  `tool_result` blocks in the next turn, which put them first; a result
  answers a `tool_use` of the turn just before (anthropics/claude-code#5060,
  docs "Handling tool use and tool result content blocks");
- `tool_use` ids match `^[a-zA-Z0-9_-]+$` and are unique in the request
  (anthropics/claude-code#20901; anomalyco/opencode#1279);
- at most 4 `cache_control` breakpoints (tghamm/Anthropic.SDK#50);
- thinking (docs "Extended thinking"): only on models that think
  (`tests.emulator.models`), `budget_tokens` at least 1,024 and below
  `max_tokens` (themaximalist/llm.js#30, liuw1535/antigravity2api-nodejs#149);
  with thinking on, a request that continues a tool round (ends in tool
  results) needs the assistant turn before them to start with a thinking
  block (n8n-io/n8n#22550, anomalyco/opencode#3077); and a thinking block sent
  back must carry the signature the API gave it (langchain-ai/langchain#33391,
  anthropics/anthropic-sdk-python#1598).

Error indices name the message and block as sent; where combined turns matter
(pairing), the index is that of the turn's first message.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from typing import Any

from tests.emulator.models import Model
from tests.emulator.wire import ApiError

MAX_BREAKPOINTS = 4
MIN_BUDGET = 1024
TOOL_ID = re.compile(r"[a-zA-Z0-9_-]+")
THINKING = ("thinking", "redacted_thinking")
SECRET = b"cyrene-emulator"
DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"


@dataclass(frozen=True)
class Block:
    """A content block, and where it was sent (message index, index in its content)."""

    message: int
    index: int
    data: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.data.get("type"))


@dataclass
class Turn:
    """Consecutive messages of one role, combined as the API combines them."""

    role: str
    first: int
    blocks: list[Block] = field(default_factory=list)

    def ids(self, kind: str, key: str) -> list[str]:
        return [str(b.data.get(key)) for b in self.blocks if b.type == kind]


def sign(thinking: str) -> str:
    """The signature the emulator gives a thinking block (and checks when it comes back)."""
    digest = hmac.new(SECRET, thinking.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def blocks_of(content: Any) -> list[dict[str, Any]]:
    """A message's content as blocks (a string is shorthand for one text block; "" for none)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content or [])


def check_request(body: dict[str, Any], model: Model, generates: bool) -> None:
    """Every rule on a request body, in the order the API reports them."""
    check_thinking_knob(body, model, generates)
    check_breakpoints(body)
    turns = combined_turns(body.get("messages") or [])
    check_tool_ids(turns)
    check_pairing(turns)
    if (body.get("thinking") or {}).get("type") == "enabled":
        check_final_assistant(turns)
    check_signatures(turns)


def check_thinking_knob(body: dict[str, Any], model: Model, generates: bool) -> None:
    thinking = body.get("thinking") or {}
    if thinking.get("type") != "enabled":
        return
    if not model.reasons:
        raise ApiError(400, f"'{body.get('model')}' does not support thinking.")
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < MIN_BUDGET:
        raise ApiError(
            400,
            f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_BUDGET}",
        )
    if generates and body.get("max_tokens", 0) <= budget:
        raise ApiError(
            400,
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
            f"documentation at {DOCS}#max-tokens-and-context-window-size",
        )


def check_breakpoints(body: dict[str, Any]) -> None:
    if (found := json.dumps(body).count('"cache_control"')) > MAX_BREAKPOINTS:
        raise ApiError(
            400,
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {found}.",
        )


def combined_turns(messages: list[dict[str, Any]]) -> list[Turn]:
    """The messages as turns, once each passes the role and content rules."""
    if not messages:
        raise ApiError(400, "messages: List should have at least 1 item after validation, not 0")
    turns: list[Turn] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise ApiError(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
        blocks = blocks_of(message.get("content"))
        check_content(i, blocks, final_assistant=role == "assistant" and i == len(messages) - 1)
        if not turns or turns[-1].role != role:
            turns.append(Turn(role, i))
        turns[-1].blocks += [Block(i, j, b) for j, b in enumerate(blocks)]
    return turns


def check_content(i: int, blocks: list[dict[str, Any]], final_assistant: bool) -> None:
    if not blocks and not final_assistant:
        raise ApiError(
            400,
            f"messages.{i}: all messages must have non-empty content except for the optional "
            "final assistant message",
        )
    texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
    if any(not text for text in texts):
        raise ApiError(400, "messages: text content blocks must be non-empty")
    if any(not text.strip() for text in texts):
        raise ApiError(400, "messages: text content blocks must contain non-whitespace text")


def check_tool_ids(turns: list[Turn]) -> None:
    seen: set[str] = set()
    for block in (b for turn in turns for b in turn.blocks if b.type == "tool_use"):
        where = f"messages.{block.message}.content.{block.index}"
        tool_id = str(block.data.get("id", ""))
        if not TOOL_ID.fullmatch(tool_id):
            raise ApiError(
                400, f"{where}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
            )
        if tool_id in seen:
            raise ApiError(400, f"{where}: `tool_use` ids must be unique")
        seen.add(tool_id)


def check_pairing(turns: list[Turn]) -> None:
    """Each turn's results answer the turn before; each turn's calls are answered next."""
    for k, turn in enumerate(turns):
        previous = turns[k - 1] if k else None
        uses = previous.ids("tool_use", "id") if previous and previous.role == "assistant" else []
        for block in (b for b in turn.blocks if b.type == "tool_result"):
            if block.data.get("tool_use_id") not in uses:
                raise ApiError(
                    400,
                    f"messages.{block.message}.content.{block.index}: unexpected `tool_use_id` "
                    f"found in `tool_result` blocks: {block.data.get('tool_use_id')}. Each "
                    "`tool_result` block must have a corresponding `tool_use` block in the "
                    "previous message.",
                )
        following = turns[k + 1] if k + 1 < len(turns) else None
        if missing := [i for i in turn.ids("tool_use", "id") if i not in first_results(following)]:
            raise ApiError(
                400,
                f"messages.{turn.first}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message.",
            )


def first_results(turn: Turn | None) -> list[str]:
    """The ids of the `tool_result` blocks a turn opens with (results after text do not count)."""
    ids: list[str] = []
    for block in turn.blocks if turn is not None else []:
        if block.type != "tool_result":
            break
        ids.append(str(block.data.get("tool_use_id")))
    return ids


def check_final_assistant(turns: list[Turn]) -> None:
    """With thinking on, the assistant turn a request continues must start with thinking:
    the last turn (a prefill), or the one before the last turn's tool results."""
    last = turns[-1]
    if last.role == "user" and not last.ids("tool_result", "tool_use_id"):
        return
    final = last if last.role == "assistant" else (turns[-2] if len(turns) > 1 else None)
    if final is None or not final.blocks or final.blocks[0].type in THINKING:
        return
    first = final.blocks[0]
    raise ApiError(
        400,
        f"messages.{first.message}.content.{first.index}.type: Expected `thinking` or "
        f"`redacted_thinking`, but found `{first.type}`. When `thinking` is enabled, a final "
        "`assistant` message must start with a thinking block (preceeding the lastmost set of "
        "`tool_use` and `tool_result` blocks). We recommend you include thinking blocks from "
        f"previous turns. To avoid this requirement, disable `thinking`. Please consult our "
        f"documentation at {DOCS}",
    )


def check_signatures(turns: list[Turn]) -> None:
    for block in (b for turn in turns for b in turn.blocks if b.type == "thinking"):
        if block.data.get("signature") != sign(str(block.data.get("thinking", ""))):
            raise ApiError(
                400,
                f"messages.{block.message}.content.{block.index}: Invalid `signature` in "
                "`thinking` block",
            )
