"""``list_hooks``: which hook functions are attached where, for any object with a ``hook_dict``.

``model.list_hooks()`` maps each hook name to the hooks attached there (hook points with
none are left out), in the order they run; each entry's ``user_hook`` is the function
that was added, ``is_permanent`` and ``context_level`` say how. This is TransformerLens 3's
``HookIntrospectionMixin``, with one difference: a name (or list of names) that is not a
hook point raises ``KeyError`` with the closest ones, where TransformerLens returns ``{}``
(a typo must not look like "no hooks here").

>>> from interp_transformer.hooks import HookedRootModule, HookPoint
>>> class Toy(HookedRootModule):
...     def __init__(self):
...         super().__init__()
...         self.hook_a, self.hook_b = HookPoint(), HookPoint()
...         self.setup()
>>> toy = Toy()
>>> def double(x, hook):
...     return 2 * x
>>> _ = toy.hook_a.add_hook(double)
>>> {name: [h.user_hook.__name__ for h in hooks] for name, hooks in toy.list_hooks().items()}
{'hook_a': ['double']}
>>> toy.hook_a
HookPoint(name='hook_a', 1 fwd)
"""

import difflib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

NamesFilter = None | str | Sequence[str] | Callable[[str], bool]


class HookIntrospectionMixin:
    """``list_hooks()`` for a class with a ``hook_dict`` (an attribute or a property) of hook points."""

    if TYPE_CHECKING:  # what the class using the mixin provides (a property here, so an attribute may override it)

        @property
        def hook_dict(self) -> dict[str, Any]: ...

    def list_hooks(
        self,
        name_filter: NamesFilter = None,
        dir: Literal["fwd", "bwd", "both"] = "both",
        including_permanent: bool = True,
    ) -> dict:
        """``{hook name: [hook, ...]}`` of the hooks this thread's forward runs, hook points without any left out.

        ``name_filter``: None (every hook point), a name, a list of names, or a predicate on
        names; ``dir``: ``"fwd"``, ``"bwd"`` or ``"both"`` (forward hooks first);
        ``including_permanent=False`` leaves permanent hooks out.
        """
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")
        hook_dict = self.hook_dict
        if name_filter is None:
            selected = list(hook_dict)
        elif callable(name_filter):
            selected = [name for name in hook_dict if name_filter(name)]
        else:
            names = [name_filter] if isinstance(name_filter, str) else list(name_filter)
            for name in names:
                if name not in hook_dict:
                    close = difflib.get_close_matches(str(name), hook_dict, n=3, cutoff=0.5)
                    raise KeyError(f"no hook point named {name!r}; closest: {close}")
            selected = [name for name in hook_dict if name in set(names)]
        found = {}
        for name in selected:
            point = hook_dict[name]
            hooks = (point.fwd_hooks if dir in ("fwd", "both") else []) + (
                point.bwd_hooks if dir in ("bwd", "both") else []
            )
            hooks = [hook for hook in hooks if including_permanent or not hook.is_permanent]
            if hooks:
                found[name] = hooks
        return found


__all__ = ["HookIntrospectionMixin", "NamesFilter"]
