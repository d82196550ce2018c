"""`Vision`: who describes the images a model cannot see, and which images are let in."""

from __future__ import annotations

from typing import Any, NotRequired, Protocol, runtime_checkable

from langchain_core.language_models import BaseChatModel
from pydantic import Field

from nodes.core.feature import Feature
from nodes.core.state import LoopState

MAX_IMAGE_BYTES = 10 * 1024 * 1024


@runtime_checkable
class ImageDescriber(Protocol):
    """Turns one image content block into text (a vision model's answer, OCR, a caption)."""

    def __call__(self, block: dict[str, Any], /) -> str: ...


class VisionState(LoopState):
    """The key vision keeps in a session."""

    image_descriptions: NotRequired[dict[str, str]]
    """Image hash → its description (an image sent again is not described again)."""


class Vision(Feature):
    """Images the answering model can't see become cached text descriptions.

    Example:
        >>> LoopConfig(model=model, features=[Vision(describer=init_chat_model("openai:gpt-4o-mini"))])
    """

    state_schema = VisionState

    describer: BaseChatModel | ImageDescriber | None = Field(
        default=None,
        description="a vision chat model or `describe(block) -> str`; `None` passes images through",
    )
    model_accepts_images: bool | None = Field(
        default=None,
        description="keep images for the main model; `None` reads the model's LangChain profile",
    )
    max_image_bytes: int = Field(
        default=MAX_IMAGE_BYTES,
        gt=0,
        description="larger images become a placeholder, never an exception",
    )

    @property
    def on(self) -> bool:
        """Whether `resolve_vision` runs (images are described)."""
        return self.describer is not None
