"""A seeded, generated product catalogue and instruction goals for the offline WebShop-style environment (nothing is
downloaded), and the reward of a purchase (:func:`purchase_reward`, WebShop's structure). A goal is written from one
target product; any product of the same type with the asked attributes, options and price satisfies it.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import asdict, dataclass, field

__all__ = ["Catalog", "CatalogConfig", "Goal", "Product", "generate_catalog", "purchase_reward", "tokenize"]

_COLORS = ["black", "white", "red", "navy blue", "grey", "green", "pink", "beige", "brown", "yellow"]

# category -> (product types, attribute pool, option groups {name: values}, price range in dollars)
_CATEGORIES: dict[str, tuple[list[str], list[str], dict[str, list[str]], tuple[float, float]]] = {
    "clothing": (
        ["t-shirt", "hoodie", "jeans", "dress", "sweater", "shorts", "pajama set"],
        ["cotton", "polyester", "machine washable", "slim fit", "long sleeve", "short sleeve", "relaxed fit",
         "wrinkle free", "stretch", "moisture wicking"],
        {"color": _COLORS, "size": ["x-small", "small", "medium", "large", "x-large", "xx-large"]},
        (8.0, 80.0),
    ),
    "shoes": (
        ["sneakers", "boots", "sandals", "loafers", "running shoes", "slippers"],
        ["leather", "non slip", "waterproof", "rubber sole", "memory foam", "lightweight", "arch support",
         "breathable"],
        {"color": _COLORS, "size": ["6", "7", "8", "9", "10", "11", "12"]},
        (15.0, 140.0),
    ),
    "beauty": (
        ["shampoo", "face cream", "lipstick", "body lotion", "hair serum", "sunscreen"],
        ["paraben free", "cruelty free", "vegan", "long lasting", "sulfate free", "fragrance free",
         "natural ingredients", "dermatologist tested"],
        {"scent": ["lavender", "vanilla", "coconut", "unscented", "rose", "citrus"],
         "size": ["2 oz", "4 oz", "8 oz", "16 oz"]},
        (4.0, 60.0),
    ),
    "grocery": (
        ["coffee beans", "green tea", "protein bars", "trail mix", "olive oil", "dark chocolate"],
        ["gluten free", "organic", "sugar free", "keto friendly", "non gmo", "low carb", "high protein", "kosher"],
        {"flavor": ["original", "salted caramel", "mint", "hazelnut", "berry", "vanilla bean"],
         "pack": ["pack of 1", "pack of 3", "pack of 6", "pack of 12"]},
        (3.0, 45.0),
    ),
    "electronics": (
        ["headphones", "phone case", "charging cable", "bluetooth speaker", "wireless mouse", "power bank"],
        ["wireless", "fast charging", "noise cancelling", "water resistant", "usb c", "long battery life", "compact",
         "shockproof"],
        {"color": _COLORS, "bundle": ["standard", "with carrying case", "2 pack"]},
        (9.0, 200.0),
    ),
    "home": (
        ["throw pillow", "bath towel", "coffee mug", "table lamp", "storage basket", "bed sheet set"],
        ["easy clean", "machine washable", "bpa free", "eco friendly", "dishwasher safe", "space saving", "handmade",
         "stain resistant"],
        {"color": _COLORS, "size": ["small", "medium", "large"]},
        (6.0, 90.0),
    ),
}

_BRAND_A = ["nor", "vel", "quin", "astra", "bram", "cor", "dax", "elm", "fen", "hal", "ivo", "jun", "kes", "lum",
            "mav", "oro", "pax", "rue", "sol", "tor"]
_BRAND_B = ["dale", "wick", "ton", "ora", "ex", "ly", "field", "mark", "well", "stone"]
_ASIN_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"

_INSTRUCTION_OPENERS = ["i want", "i need", "i am looking for", "find me", "get me"]

_TOKEN_RE = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric words: the tokenizer of both the search index and search queries."""
    return _TOKEN_RE.findall(text.lower())


@dataclass(frozen=True)
class CatalogConfig:
    """What the generator builds: the same config always yields the same catalogue. Goal ``i`` is WebShop's
    ``session_id`` ``i``; goals ``0 .. n_test-1`` are the ``test`` split, the next ``n_dev`` the ``dev`` split, the rest
    ``train``. ``page_size``: search results per page; ``max_results``: results kept per query."""

    seed: int = 0
    n_products: int = 300
    n_goals: int = 600
    n_test: int = 100
    n_dev: int = 100
    page_size: int = 10
    max_results: int = 50

    def __post_init__(self) -> None:
        for name, least in (("n_products", 1), ("n_goals", 1), ("page_size", 1), ("max_results", 1), ("seed", 0),
                            ("n_test", 0), ("n_dev", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < least:
                raise ValueError(f"CatalogConfig.{name} must be an int >= {least}, got {value!r}")
        if self.n_test + self.n_dev >= self.n_goals:
            raise ValueError(f"CatalogConfig: n_test + n_dev ({self.n_test} + {self.n_dev}) must be below n_goals "
                             f"({self.n_goals}) so that the train split is not empty")


@dataclass(frozen=True)
class Product:
    """One catalogue item. ``options`` maps an option group (``"color"``) to the values offered for this item."""

    asin: str
    category: str
    product_type: str
    brand: str
    title: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    price: float
    description: str
    features: tuple[str, ...]

    def search_text(self) -> str:
        """The text the search index sees: title, type, category, attributes, option values, description."""
        option_words = " ".join(v for values in self.options.values() for v in values)
        return " ".join([self.title, self.product_type, self.category, " ".join(self.attributes), option_words,
                         self.description])


@dataclass(frozen=True)
class Goal:
    """One instruction. Any product of ``product_type`` with ``attributes``, the ``options`` values chosen and a price
    at most ``price_upper`` earns reward 1; ``target_asin`` is the product the goal was written from."""

    index: int
    instruction: str
    product_type: str
    category: str
    attributes: tuple[str, ...]
    options: dict[str, str]
    price_upper: float
    target_asin: str
    query: str = field(default="")

    def to_dict(self) -> dict:
        return {**asdict(self), "attributes": list(self.attributes)}


@dataclass
class Catalog:
    """The generated products and goals, with the split of goal indices."""

    config: CatalogConfig
    products: list[Product]
    goals: list[Goal]

    def __post_init__(self) -> None:
        self.by_asin: dict[str, Product] = {p.asin: p for p in self.products}

    def split(self, name: str) -> list[int]:
        """Goal indices of ``name``: ``test`` first, then ``dev``, then ``train`` (WebShop's ordering convention)."""
        c = self.config
        n_held_out = c.n_test + c.n_dev
        ranges = {"test": (0, c.n_test), "dev": (c.n_test, n_held_out), "train": (n_held_out, c.n_goals)}
        if name not in ranges:
            raise ValueError(f"unknown split {name!r}; known: test, dev, train")
        return list(range(*ranges[name]))


def purchase_reward(goal: Goal, product: Product, selected: dict[str, str]) -> float:
    """Reward of buying ``product`` with option choices ``selected`` for ``goal`` (WebShop's reward structure):
    ``r_type · (n_attr + n_opt + n_price) / (|attrs| + |opts| + 1)``, ``r_type`` 1 for the asked product type, 0.5 for
    another type of the same category, else 0. Exactly 1 only when every requirement is met."""
    r_type = 1.0 if product.product_type == goal.product_type else 0.5 if product.category == goal.category else 0.0
    n_attr = sum(1 for a in goal.attributes if a in product.attributes)
    n_opt = sum(1 for name, value in goal.options.items() if selected.get(name) == value)
    n_price = 1 if product.price <= goal.price_upper else 0
    total = len(goal.attributes) + len(goal.options) + 1
    return r_type * (n_attr + n_opt + n_price) / total


def generate_catalog(config: CatalogConfig | None = None) -> Catalog:
    """Build the catalogue and goals of ``config`` (deterministic in ``config.seed``)."""
    config = config or CatalogConfig()
    rng = random.Random(config.seed)
    products = [_make_product(rng, i) for i in range(config.n_products)]
    goals = [_make_goal(rng, i, rng.choice(products)) for i in range(config.n_goals)]
    return Catalog(config=config, products=products, goals=goals)


def _make_asin(rng: random.Random, i: int) -> str:
    # "b0" + 8 characters like WebShop's lower-cased ASINs; the index suffix keeps them unique.
    body = "".join(rng.choice(_ASIN_CHARS) for _ in range(4))
    return f"b0{body}{i:04d}"


def _make_product(rng: random.Random, i: int) -> Product:
    category = rng.choice(sorted(_CATEGORIES))
    types, attr_pool, option_groups, (lo, hi) = _CATEGORIES[category]
    product_type = rng.choice(types)
    brand = (rng.choice(_BRAND_A) + rng.choice(_BRAND_B)).capitalize()
    attributes = tuple(rng.sample(attr_pool, rng.randint(3, 4)))
    options = {}
    for name, values in option_groups.items():
        chosen = rng.sample(values, rng.randint(2, min(5, len(values))))
        options[name] = tuple(v for v in values if v in chosen)  # keep the vocabulary's natural order
    price = round(rng.uniform(lo, hi), 2)
    title = f"{brand} {' '.join(attributes[:2])} {product_type}".strip()
    description = (
        f"This {product_type} from {brand} is {', '.join(attributes[:-1])} and {attributes[-1]}. "
        f"Available in {len(next(iter(options.values())))} {next(iter(options))} choices."
    )
    features = tuple(f"{a.capitalize()}." for a in attributes)
    return Product(asin=_make_asin(rng, i), category=category, product_type=product_type, brand=brand, title=title,
                   attributes=attributes, options=options, price=price, description=description, features=features)


def _make_goal(rng: random.Random, index: int, target: Product) -> Goal:
    attributes = tuple(rng.sample(list(target.attributes), rng.randint(1, 2)))
    options = {name: rng.choice(values) for name, values in target.options.items()}
    # a round bound above the target price: 10–60 % headroom, rounded up to whole dollars
    price_upper = float(math.ceil(target.price * rng.uniform(1.1, 1.6)))
    article = "an" if attributes[0][0] in "aeio" else "a"
    option_text = " and ".join(f"{name}: {value}" for name, value in options.items())
    instruction = (
        f"{rng.choice(_INSTRUCTION_OPENERS)} {article} {' '.join(attributes)} {target.product_type} "
        f"with {option_text}, and price lower than {price_upper:.2f} dollars"
    )
    return Goal(index=index, instruction=instruction, product_type=target.product_type, category=target.category,
                attributes=attributes, options=options, price_upper=price_upper, target_asin=target.asin,
                query=" ".join([*attributes, target.product_type]))
