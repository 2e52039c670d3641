"""The tag pipeline without a server: the HTTP process's intake (one Stamped out per request), the scheduler's
reading of it, and the fixed-prompt boundary made a page-aligned offset where the tree is split and tagged."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from agentcache.tags import HEADER, KEY, Stamped, TagError, Tags, agent_of, header_object


def request_with(headers: dict[str, str] | None = None, key: str = "") -> object:
    from starlette.requests import Request as StarletteRequest

    raw = [(name.encode(), value.encode()) for name, value in (headers or {}).items()]
    if key:
        raw.append((b"authorization", f"Bearer {key}".encode()))
    return StarletteRequest({"type": "http", "method": "POST", "path": "/generate", "headers": raw})


def accept_tags(params: dict, raw_request: object, tokenizer: object, text: object, input_ids: object) -> None:
    """One prompt through the generate hooks as SGLang runs them: its tags taken, its fixed text tokenized, its
    stamp made once SGLang has tokenized it (to `input_ids`, else to the tokenizer's ids of `text`)."""
    from agentcache.server_ext.intake import stamp_tokenized, take_tags, tokenize_fixed_text

    pending = take_tags(params, raw_request, text, input_ids)
    if pending is None:
        return
    if pending.fixed_text is not None:
        asyncio.run(tokenize_fixed_text(params, pending, tokenizer))
    if input_ids is None and tokenizer is not None and isinstance(text, str):
        input_ids = tokenizer.encode(text)
    stamp_tokenized(params, input_ids)


def stamped_in(params: dict) -> Stamped:
    found = params["custom_params"][KEY]
    assert isinstance(found, dict), "SGLang's IPC carries a flat object, never a Python object"
    assert not any(isinstance(v, (dict, list, tuple)) for v in found.values())
    return Stamped.from_wire(found)


# ---------------------------------------------------------------- Stamped on the wire


def test_stamped_tags_read_back_as_they_were_written():
    tags = Tags(workflow="w", agent="a:1", agent_name="coder", fixed_tokens=12, tenant="t/1", ts=5.0)
    assert Stamped.from_wire(Stamped("t/1", tags).to_wire()) == Stamped("t/1", tags)
    implicit = tags.replace(implicit=True, agent_name=None)
    back = Stamped.from_wire(Stamped("t/1", implicit).to_wire())
    assert back.tags is not None and back.tags.implicit and back.tags.tenant == "t/1"
    assert Stamped.from_wire(Stamped("t/1", None, "bad_agent").to_wire()) == Stamped("t/1", None, "bad_agent")


def test_what_did_not_pass_intake_is_read_as_untagged_or_refused():
    assert Stamped.from_wire(None) == Stamped("", None, None), "no tags at all: untagged, no reason"
    assert Stamped.from_wire("x") == Stamped("", None, "not_an_object")
    assert Stamped.from_wire({"v": 1, "workflow": "w", "tenant": "t"}) == Stamped("t", None, "bad_agent")


def test_a_header_that_is_not_json_is_refused_as_bad_header():
    assert header_object('{"v": 1}') == {"v": 1}
    for text in ("{", "[" * 100_000):
        with pytest.raises(TagError) as refused:
            header_object(text)
        assert refused.value.reason == "bad_header"


# ---------------------------------------------------------------- /generate intake


def test_generate_tags_are_stamped_with_the_tenant_and_the_clock_whatever_the_client_wrote():
    from agentcache.server_ext.tenancy import tenant_of_request

    request = request_with(key="k1")
    tags = {"v": 1, "workflow": "w", "agent": "a:1", "fixed_tokens": 2, "tenant": "victim", "ts": 0.0}
    params = {"custom_params": {KEY: tags, "other": 1}}
    accept_tags(params, request, None, None, [1, 2, 3])
    stamped = stamped_in(params)
    assert stamped.tenant == tenant_of_request(request) != "victim"
    assert stamped.tags is not None and stamped.tags.fixed_tokens == 2 and stamped.tags.ts and stamped.tags.ts > 0
    assert params["custom_params"]["other"] == 1, "the app's own custom_params stay"


def test_generate_tags_with_a_boundary_past_the_prompt_or_in_a_bad_header_are_refused_with_the_reason():

    params: dict = {"custom_params": {KEY: {"v": 1, "workflow": "w", "agent": "a", "fixed_tokens": 4}}}
    accept_tags(params, None, None, None, [1, 2, 3])
    assert stamped_in(params) == Stamped("", None, "bad_fixed_tokens")
    params = {"max_new_tokens": 1}
    accept_tags(params, request_with({HEADER: "not json"}), None, None, [1])
    assert stamped_in(params) == Stamped("", None, "bad_header")
    params = {}
    accept_tags(params, request_with({HEADER: json.dumps({"v": 1, "workflow": "w", "agent": "a"})}), None, None, [1])
    assert stamped_in(params).tags is not None, "the header carries the same tags where a proxy drops the body's"


def test_fixed_chars_become_tokens_of_the_tokenized_text():

    tokenizer = SimpleNamespace(encode=lambda text: [ord(c) for c in text.replace(" ", "")])
    params: dict = {"custom_params": {KEY: {"v": 1, "workflow": "w", "agent": "a", "fixed_chars": 5}}}
    accept_tags(params, None, tokenizer, "ab cd ef", None)
    tags = stamped_in(params).tags
    assert tags is not None and tags.fixed_tokens == 4


def test_a_generate_request_without_tags_gets_a_workflow_of_its_own_or_nothing_where_tags_cannot_go():

    params: dict = {}
    accept_tags(params, None, None, "hello", None)
    tags = stamped_in(params).tags
    assert tags is not None and tags.implicit and tags.workflow.startswith("~") and tags.fixed_tokens is None
    assert tags.agent == agent_of([{"role": "user", "content": "hello"}])[0]
    params = {"custom_params": "mine"}
    accept_tags(params, None, None, "hello", None)
    assert params == {"custom_params": "mine"}
    params = {}
    accept_tags(params, request_with({HEADER: "null"}), None, "hello", None)
    assert stamped_in(params).tags.implicit, "a header of JSON null is no tags"


# ---------------------------------------------------------------- chat intake


class FakeServingChat:
    """Renders messages as `role:content|`, a token a character: the first n messages' tokens are a prefix."""

    def __init__(self) -> None:
        self.tokenizer_manager = SimpleNamespace(model_config=SimpleNamespace(is_multimodal=False))

    @staticmethod
    def render(messages: list) -> list[int]:
        return [ord(c) for m in messages for c in f"{m.role}:{m.content}|"]

    def _process_messages(self, request: object, is_multimodal: bool) -> object:
        return SimpleNamespace(prompt_ids=self.render(request.messages))


def chat(tags: object = None, headers: dict[str, str] | None = None, custom: object = None) -> tuple[dict, object]:
    """A chat request through the chat hook and the generate hook, as SGLang runs them; its sampling params."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    from agentcache.server_ext.intake import after_chat_conversion

    messages = [{"role": "system", "content": "You are the coder."}, {"role": "user", "content": "Fix it."}]
    request = ChatCompletionRequest(model="m", messages=messages)
    prompt_ids = FakeServingChat.render(request.messages)
    params: dict = {"max_new_tokens": 4}
    if tags is not None:
        params["custom_params"] = {KEY: tags}
    elif custom is not None:
        params["custom_params"] = custom
    raw_request = request_with(headers, key="k")
    adapted = SimpleNamespace(sampling_params=params, input_ids=prompt_ids, text=None)
    after_chat_conversion((adapted, None), FakeServingChat(), request, raw_request)
    accept_tags(params, raw_request, None, None, prompt_ids)
    return params, request


def test_chat_fixed_messages_become_the_token_offset_where_those_messages_end():
    params, request = chat({"v": 1, "workflow": "w", "agent": "a", "fixed_messages": 1})
    tags = stamped_in(params).tags
    assert tags is not None and tags.fixed_tokens == len(FakeServingChat.render(request.messages[:1]))
    # fixed_messages, resolved, replaces whatever fixed_tokens came with it
    params, _ = chat({"v": 1, "workflow": "w", "agent": "a", "fixed_messages": 1, "fixed_tokens": "x"})
    assert stamped_in(params).tags == tags.replace(ts=stamped_in(params).tags.ts)


def test_chat_tags_in_the_header_are_read_and_a_bad_header_refused():
    wire = json.dumps({"v": 1, "workflow": "w", "agent": "a", "fixed_messages": 1})
    params, _ = chat(headers={HEADER: wire})
    tags = stamped_in(params).tags
    assert tags is not None and tags.workflow == "w" and tags.fixed_tokens
    params, _ = chat(headers={HEADER: "{nope"}, custom="mine")
    assert stamped_in(params).reason == "bad_header"


def test_a_chat_request_without_tags_gets_implicit_ones_with_its_system_messages_as_fixed_prompt():
    params, request = chat()
    tags = stamped_in(params).tags
    assert tags is not None and tags.implicit
    agent, fixed = agent_of([m.model_dump() for m in request.messages], None)
    assert tags.agent == agent and tags.fixed_tokens == len(FakeServingChat.render(request.messages[:fixed]))
    params, _ = chat(custom="mine")
    assert params["custom_params"] == "mine", "nowhere to put tags: served untagged as it is"


def test_bad_chat_tags_are_refused_with_the_reason():
    params, _ = chat({"v": 1, "workflow": "", "agent": "a"})
    assert stamped_in(params).reason == "bad_workflow"


# ---------------------------------------------------------------- the boundary in the tree


def test_the_fixed_offset_lies_within_the_prompt_on_a_page_boundary():
    from agentcache.engine.fixed_prompt import fixed_offset

    assert fixed_offset(300, 1000) == 300
    assert fixed_offset(300, 200) == 200
    assert fixed_offset(300, 1000, page_size=64) == 256
    assert fixed_offset(0, 1000, page_size=64) == 0


def test_split_and_tag_splits_at_the_boundary_with_the_trees_own_slots_and_tags_the_path():
    """The server's way (values None: the slots the tree holds), on the replay's cache."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from agentcache.engine.adapter import path_nodes
    from agentcache.engine.fixed_prompt import split_and_tag
    from agentcache.policy import make_policy
    from agentcache.replay.engine import ReplayCache

    cache = ReplayCache(1000, make_policy("lru")).cache
    free = cache.token_to_kv_pool_allocator.available_size()
    tokens = list(range(1, 101))
    slots = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    key = RadixKey(tokens)
    end = cache.insert(InsertParams(key=key, value=slots, prev_prefix_len=0, inserted_len=0)).last_device_node
    tagged = []
    tags = Tags(workflow="w", agent="a", fixed_tokens=30)
    path = split_and_tag(cache, end, key, None, 30, lambda *args: tagged.append(args), tags, 1.0, 10, 100)
    assert [len(node.key) for node in path] == [30, 70] and path == path_nodes(cache, end)
    assert tagged == [(path, tags, 1.0, 10, 100)]
    assert cache.token_to_kv_pool_allocator.available_size() == free - len(tokens), "a split frees or takes nothing"
    again = split_and_tag(cache, end, key, None, 30, lambda *args: None, tags, 2.0)
    assert again == path, "a boundary made already is left as it is"
    deeper = split_and_tag(cache, end, key, None, 500, lambda *args: None, tags, 2.0)
    assert deeper == path, "a boundary past the path splits nothing"
